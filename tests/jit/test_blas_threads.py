"""The interpreter tier's BLAS thread limit."""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.jit import blas_threads


def test_blas_threads_are_limited_inside_and_restored_after():
    libraries = blas_threads._libraries()
    if not libraries:
        pytest.skip("NumPy has no BLAS library loaded that threadpoolctl knows")
    before = [lib.num_threads for lib in libraries]
    a = np.random.default_rng(0).standard_normal((64, 64))
    with blas_threads.limited(1):
        assert [lib.num_threads for lib in libraries] == [1] * len(libraries)
        np.testing.assert_allclose(a @ a.T, (a @ a.T).T, rtol=1e-12)
    assert [lib.num_threads for lib in libraries] == before
    with blas_threads.limited(0):  # no core left free: still one thread
        assert [lib.num_threads for lib in libraries] == [1] * len(libraries)
    with blas_threads.limited(max(before) + 1):  # more than it has: unchanged
        assert [lib.num_threads for lib in libraries] == before
