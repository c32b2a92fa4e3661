"""Compiled steps flush subnormals to zero (FTZ/DAZ) inside, and leave the caller's mode alone."""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import fp_env
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.schedule_rates import PARALLEL_WORK_MIN

pytestmark = pytest.mark.skipif(not fp_env.supported(), reason="FTZ/DAZ is only set on x86-64")

TINY = np.finfo(np.float32).tiny  # smallest normal float32


def _flushed(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < TINY, 0, x).astype(x.dtype)


def _graph(k: int, n: int) -> Graph:
    x = make_node("input", [], name="x", shape=("N", k), dtype="float32")
    w = make_node("param", [], name="w", shape=(k, n), dtype="float32")
    s = make_node("param", [], name="s", shape=(n,), dtype="float32")
    product = make_node("matmul", [x, w])
    scaled = make_node("mul", [x, make_node("const", [], value=1e10, dtype="float32")])
    return Graph((x,), (w, s), (product, scaled, make_node("mul", [product, s])), name="subnormals")


@pytest.mark.parametrize("k, n, batch", [(3, 5, 7), (257, 1024, 33)])  # small loops; blocked products on threads
def test_subnormal_inputs_read_as_zero_and_subnormal_results_are_flushed(k, n, batch):
    graph = _graph(k, n)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, k)).astype(np.float32)
    x[::2] *= np.float32(1e-39)  # every other row subnormal: DAZ makes these rows 0
    w = rng.standard_normal((k, n)).astype(np.float32)
    s = np.full(n, 2e-38, np.float32)  # normal, but product * s is subnormal wherever |product| < 0.59
    assert np.count_nonzero(np.abs(x) < TINY) > 0
    got = CpuBackend().compile(graph).run([x], [w, s])
    want, _ = evaluate(graph, [_flushed(x)], [w, s], batch)
    if k * n >= PARALLEL_WORK_MIN:  # the rows of both kinds were spread over the thread pool
        assert "omp.parallel" in CpuBackend().compile(graph).stages["llvm"]
    np.testing.assert_allclose(got[0], want[0], rtol=2e-4, atol=2e-4)
    assert not got[0][::2].any() and not got[1][::2].any()  # subnormal rows read as exact zeros
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    third = _flushed(want[2])
    assert np.count_nonzero(third != want[2]) > 0, "the check needs results in the subnormal range"
    assert not (np.abs(got[2][got[2] != 0]) < TINY).any()
    np.testing.assert_allclose(got[2] / s, third / s, rtol=2e-4, atol=2e-4)


def test_the_callers_floating_point_mode_is_restored():
    graph = _graph(3, 5)
    CpuBackend().compile(graph).run([np.ones((2, 3), np.float32)], [np.ones((3, 5), np.float32),
                                                                     np.ones(5, np.float32)])
    half_tiny = np.float32(TINY) / np.float32(2)  # computed by numpy on this thread after the call
    assert half_tiny != 0 and half_tiny * np.float32(1) == half_tiny
