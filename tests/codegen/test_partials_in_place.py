"""A k-range product's partial sums added over its first partial: no copy of it, same results."""

from __future__ import annotations

import re

import pytest

from mlir_nn.backends.cpu import CpuBackend, lower_with_plan
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.cpu_matmul import product_plan
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.pipelines import load_pipeline
from tests.codegen.test_cpu_matmul import _assert_matches_reference


def _weight_gradient(m: int, n: int, dtype: str) -> Graph:
    x = make_node("input", [], name="x", shape=("N", m), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", n), dtype=dtype)
    return Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")


@pytest.mark.parametrize("m, n, dtype", [(100, 100, "float32"), (65, 70, "float64")])
def test_the_partials_are_summed_over_the_first_without_a_copy(m, n, dtype):
    """Bufferization copied the first partial sum (slot 0 of the partials) into a buffer of its
    own for the sum of the others: no kernel copies it now, and the step matches the reference
    below the switch (one range), at it and above (TASKS_MAX ranges)."""
    graph = _weight_gradient(m, n, dtype)
    module = emit_linalg(graph)
    (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
    plan = product_plan(op, threads=True)
    if plan.kind != "blocked" or plan.k_ranges is None:
        pytest.skip(f"{m} x {n} is not summed in ranges of the batch here: {plan.reason}")
    split = lower_with_plan(graph, load_pipeline("cpu"))[4]
    assert split is not None
    copies = [k for k in split.kernels.values() if re.search(r"memref\.copy %\w+, %\w+ : memref<\d+x\d+x\d+x\d+x", k)]
    assert not copies, copies[0][-400:]
    rows, batch_min, _ = plan.k_ranges
    batches = (1, 7, 13, 33, 257, batch_min - 1, batch_min, batch_min + rows + 3, 4099)
    _assert_matches_reference(graph, CpuBackend().compile(graph), batches, dtype)
