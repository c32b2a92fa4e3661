"""Batched products (attention's ``q @ k^T``, ``p @ v`` and their gradients) on the CUDA path."""

import numpy as np
import pytest

pytest.importorskip("mlir")

from mlir_nn.gpu.simt_check import check_graph  # noqa: E402
from mlir_nn.jit import trace_step  # noqa: E402


@pytest.mark.parametrize("shapes", [((3, 5, 7), (3, 7, 4)), ((2, 3, 5, 6), (2, 3, 6, 5))])
def test_bmm_runs_clean_on_the_simt_interpreter(shapes):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    graph, _, _ = trace_step(lambda x, y: x @ y, [a, b], ["a", "b"], dynamic_batch=False)
    assert any(n.op == "bmm" for n in graph.nodes)
    result = check_graph(graph, shapes[0][0])
    assert result.ok, result.line
