"""The moons step (MLP 2-32-32-16-1, batch 100, MSE, SGD lr 0.005) through the optimizer."""

import numpy as np
import pytest
from sklearn.datasets import make_moons

from mlir_nn import jit
from mlir_nn.cli import main
from mlir_nn.egraph import optimize
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step
from tests.egraph.util import assert_same, trace_mlp

MOONS = [2, 32, 32, 16, 1]


@pytest.fixture(scope="module")
def moons():
    graph = trace_mlp(MOONS, 100, "--lr", "0.005", dtype="float32")[0]
    return graph, *optimize(graph, batch_estimate=100)


def test_fewer_nodes_and_lower_cost(moons):
    graph, optimized, report = moons
    assert report.error is None and report.used_optimized
    assert report.nodes_after < report.nodes_before == len(graph.compute_nodes)
    assert report.cost_after < report.cost_before


def test_fused_forward_no_transpose_and_gemm_updates(moons):
    graph, optimized, _ = moons
    counts = optimized.op_counts()
    assert "transpose" not in counts
    fused = [n for n in optimized.nodes if n.op == "linear" and n.attr("activation") == "relu"]
    assert len(fused) == 3
    weights = {p.attr("name") for p in graph.params if len(p.shape) == 2}
    for name, node in optimized.updates:
        if name in weights:
            assert node.op == "gemm" and node.inputs[2] == optimized.param_by_name(name)
    assert sum(1 for name, _ in optimized.updates if name in weights) == 4


def test_optimized_moons_step_computes_the_same(moons):
    graph, optimized, _ = moons
    as64 = trace_mlp(MOONS, 100, "--lr", "0.005")[0]
    assert_same(as64, optimize(as64, batch_estimate=100)[0], batch=100)


def test_cli_stats_and_optimized_stage(capsys):
    assert main(["compile", "--mlp", "2,32,32,16,1", "--batch", "100", "--emit", "optimized", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert "transpose(" not in out and out.count('activation="relu"') == 3 and out.count("gemm(") == 4
    assert "nodes: 50 -> " in err and "estimated cost" in err and "rules applied" in err and "egraph" in err
    assert main(["compile", "--mlp", "2,32,32,16,1", "--emit", "optimized", "--no-egraph", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert "transpose(" in out and "rules applied" not in err


def _train(optimize_step: bool, epochs: int = 15, batch: int = 10) -> list[float]:
    np.random.seed(0)
    X, y = make_moons(n_samples=100, noise=0.1, random_state=42)
    target = (2.0 * y - 1.0).reshape(-1, 1)
    model = MLP(2, MOONS[1:], dtype="float64")
    opt = SGD(model.parameters(), lr=0.005)
    compiled = jit(train_step(model, opt), backend="numpy", optimize=optimize_step)
    losses = []
    for _ in range(epochs):
        for i in range(0, len(X), batch):
            losses.append(float(compiled(X[i:i + batch], target[i:i + batch])))
    lowered = compiled.lower(X[:batch], target[:batch])
    assert (lowered.optimized_graph is not lowered.graph) == optimize_step
    return losses


def test_training_with_and_without_the_optimizer_gives_the_same_losses():
    on, off = _train(True), _train(False)
    assert on[-1] < on[0]
    np.testing.assert_allclose(on, off, rtol=1e-9, atol=0)
