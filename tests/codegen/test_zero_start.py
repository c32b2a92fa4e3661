"""Blocked products start their accumulators from zero registers, not a zero-filled buffer.

The accumulator's buffer is then uninitialized (or holds the previous call's values, as
the workspace is reused): each product is run twice at one batch with different inputs,
so a block that read its buffer instead of starting from zero would be caught.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
from mlir_nn.codegen.zero_start import ACC_INIT
from mlir_nn.support.cpu_target import cache_blocks
from tests.codegen.zoo import arguments, matmul_zoo

TOL = dict(rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("k, m, threads", [
    (17, 257, False),  # k in one slice: the slice loop is folded away, every block starts at zero
    (cache_blocks(4)[2] + 44, 33, False),  # two slices: the first starts at zero, the second reads it
    (600, 517, True),  # three slices, in tasks on threads
])
def test_no_accumulator_is_zero_filled(k, m, threads):
    module = emit_linalg(matmul_zoo(k, m, "float32"))
    blocked, _ = rewrite_matmuls(module, threads)
    assert blocked > 0
    text = str(module)
    assert ACC_INIT not in text
    if k > cache_blocks(4)[2]:
        assert "arith.select" in text and "mlirnn.kc_loop" in text


@pytest.mark.parametrize("k, m", [(17, 257), (cache_blocks(4)[2] + 44, 33), (600, 517)])
def test_products_match_the_reference_when_the_workspace_holds_old_values(k, m):
    graph = matmul_zoo(k, m, "float32")
    executable = CpuBackend().compile(graph)
    for seed in (1, 2, 3):  # one batch size: the same workspace, holding the previous call's values
        inputs, params = arguments(graph, 37, np.random.default_rng(seed))
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], 37)
        for node, got, expected in zip(graph.outputs, executable.run(inputs, params), want):
            np.testing.assert_allclose(got, expected, **TOL, err_msg=f"{node.op} {dict(node.attrs)} seed {seed}")
