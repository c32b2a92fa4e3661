"""``mlir_nn.jit`` runs the optimizer by default and keeps both graphs."""

import numpy as np

from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step


def _step_fn():
    np.random.seed(1)
    model = MLP(3, [8, 1], dtype="float64")
    opt = SGD(model.parameters(), lr=0.01)

    step = train_step(model, opt)

    return step


def test_jit_optimizes_by_default_and_exposes_both_stages():
    x, y = np.random.randn(5, 3), np.random.randn(5, 1)
    lowered = jit(_step_fn(), backend="numpy").lower(x, y)
    assert lowered.optimize_report is not None and lowered.optimize_report.used_optimized
    assert lowered.executable.graph is lowered.optimized_graph is not lowered.graph
    assert "linear(" in lowered.as_text("optimized") and "linear(" not in lowered.as_text("tensor")
    assert lowered.optimize_report.batch_estimate == 5


def test_jit_optimize_false_runs_the_traced_graph():
    x, y = np.random.randn(5, 3), np.random.randn(5, 1)
    lowered = jit(_step_fn(), backend="numpy", optimize=False).lower(x, y)
    assert lowered.optimize_report is None
    assert lowered.executable.graph is lowered.optimized_graph is lowered.graph
    assert lowered.as_text("optimized") == lowered.as_text("tensor")


def test_same_results_with_and_without_optimizer():
    x, y = np.random.randn(7, 3), np.random.randn(7, 1)
    on, off = jit(_step_fn(), backend="numpy"), jit(_step_fn(), backend="numpy", optimize=False)
    for _ in range(3):
        np.testing.assert_allclose(on(x, y), off(x, y), rtol=1e-12)
