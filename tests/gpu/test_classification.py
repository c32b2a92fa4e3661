"""A cross-entropy classifier step through the CUDA pipeline: compiled to PTX, and run by the
CPU emulation of its scheduled IR against the reference."""

import numpy as np
import pytest

from mlir_nn.backends.reference import evaluate
from mlir_nn.egraph import optimize
from mlir_nn.jit import trace_step
from mlir_nn.losses import cross_entropy
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import train_step
from tests.gpu.test_emulate import emulated


def classifier_graph(labels: bool):
    np.random.seed(0)
    model = MLP(6, [16, 5])
    step = train_step(model, Adam(model.parameters(), lr=0.01), cross_entropy)
    y = np.zeros(10, np.float32) if labels else np.zeros((10, 5), np.float32)
    graph, _, _ = trace_step(step, [np.zeros((10, 6), np.float32), y], ["x", "y"])
    return optimize(graph, batch_estimate=10)[0]


@pytest.mark.parametrize("labels", [True, False], ids=["labels", "probabilities"])
def test_cross_entropy_step_emulated_matches_the_reference(labels):
    graph = classifier_graph(labels)
    assert "softmax_xent_grad" in graph.op_counts()
    step = emulated(graph)
    rng = np.random.default_rng(0)
    params = [rng.uniform(0.05, 0.95, [int(d) for d in n.shape]).astype(np.float32) for n in graph.params]
    for batch in (10, 1, 33):
        x = (rng.standard_normal((batch, 6)) * 4).astype(np.float32)
        y = (rng.integers(0, 5, batch) if labels else rng.dirichlet(np.ones(5), batch)).astype(np.float32)
        outputs, updates = evaluate(graph, [x, y], [p.copy() for p in params], batch)
        want = [np.asarray(v) for v in outputs + updates]
        got = step.run([x, y] + params, [w.shape for w in want], np.float32)
        for i, (g, w) in enumerate(zip(got, want)):
            scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6 * scale, err_msg=f"result {i} at batch {batch}")


def test_cross_entropy_step_compiles_to_ptx():
    from mlir_nn.backends.cuda import compile_graph

    program = compile_graph(classifier_graph(True), ("sm_90",), cubin=False)
    assert program.ptx["sm_90"] and program.kernel_count > 0


def test_max_and_softmax_step_emulated_matches_the_reference():
    from mlir_nn.engine import Tensor
    from tests.test_losses import max_softmax_step

    rng = np.random.default_rng(1)
    w = Tensor(rng.standard_normal((4, 3)).astype(np.float32))
    graph, captured, _ = trace_step(max_softmax_step(w), [np.zeros((8, 4), np.float32),
                                                          np.zeros((8, 3), np.float32)], ["x", "y"])
    graph = optimize(graph, batch_estimate=8)[0]
    assert {"max", "eq", "softmax", "softmax_grad"} <= set(graph.op_counts())
    step = emulated(graph)
    params = [np.array(t.data, np.float32) for t in captured]  # the weights and the fed learning rate
    for batch in (8, 1, 19):
        x, y = rng.standard_normal((batch, 4)).astype(np.float32), rng.uniform(0, 1, (batch, 3)).astype(np.float32)
        outputs, updates = evaluate(graph, [x, y], [p.copy() for p in params], batch)
        want = [np.asarray(v) for v in outputs + updates]
        got = step.run([x, y] + params, [v.shape for v in want], np.float32)
        for i, (g, v) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, v, rtol=2e-5, atol=2e-6, err_msg=f"result {i} at batch {batch}")
