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


def test_a_tiny_gpt_step_is_simt_clean():
    """Attention's strided slices (the q/k/v split), scalar reshapes, token indices and the causal
    mask reach the SIMT interpreter: every kernel of the step runs there without a race, and the
    results equal the NumPy reference's."""
    from mlir_nn import nn
    from mlir_nn.optim import Adam

    np.random.seed(0)
    model = nn.GPT(96, 8, n_layer=1, n_head=2, n_embd=8)
    opt = Adam(model.parameters(), lr=1e-3)

    def step(idx, targets):
        opt.zero_grad()
        loss = model.loss(idx, targets)
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(1)
    x, y = (rng.integers(0, 96, (2, 8)).astype(np.float32) for _ in range(2))
    graph, _, _ = trace_step(step, [x, y], ["idx", "targets"], dynamic_batch=False)
    result = check_graph(graph, 2)
    assert result.ok, result.line
