"""The CUDA path's scheduled IR (fused, tiled, shared-memory staged) run on the CPU vs the reference."""

import numpy as np
import pytest

from mlir_nn.backends.reference import evaluate
from mlir_nn.gpu import fusion
from mlir_nn.gpu.emulate import EmulatedStep
from tests.gpu.conftest import MINI
from tests.gpu.test_graph_steps import traced


def emulated(graph):
    from mlir_nn.backends.cuda import graph_to_linalg

    text, func = graph_to_linalg(graph)
    results = list(graph.outputs) + [n for _, n in graph.updates]
    return EmulatedStep(text, func, [len(n.shape) for n in results])


def check_against_reference(graph, step, batches, seed=0):
    rng = np.random.default_rng(seed)
    # in (0, 1), valid for Adam's moments and bias-correction powers; inputs keep both signs for the ReLUs
    params = [rng.uniform(0.05, 0.95, [int(d) for d in n.shape]).astype(np.float32) for n in graph.params]
    for batch in batches:
        inputs = [rng.standard_normal([batch if d == "N" else d for d in n.shape]).astype(np.float32)
                  for n in graph.inputs]
        outputs, updates = evaluate(graph, inputs, [p.copy() for p in params], batch)
        want = [np.asarray(v) for v in outputs + updates]
        assert all(np.isfinite(w).all() for w in want)
        got = step.run(inputs + params, [w.shape for w in want], np.float32)
        for i, (g, w) in enumerate(zip(got, want)):  # float32 sums in another order: relative to the scale
            scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-6 * scale, err_msg=f"result {i} at batch {batch}")


@pytest.mark.parametrize("mlp,flags", [("2,32,32,16,1", []), ("3,17,2", ["--optimizer", "adam"]),
                                       ("5,20,3", ["--momentum", "0.9", "--weight-decay", "0.01"])])
def test_optimized_steps_match_the_reference(mlp, flags):
    graph = traced(mlp, 10, optimized=True, extra=flags)
    assert {"linear", "matmul_relu_grad"} <= {n.op for n in graph.nodes}  # fused nodes this checks
    check_against_reference(graph, emulated(graph), [10, 1, 33])


def test_large_mlp_step_matches_the_reference():
    graph = traced("784,1024,1024,10", 512, optimized=True)
    check_against_reference(graph, emulated(graph), [19])


def test_mini_step_matches_numpy():
    step = EmulatedStep(MINI, "mini", [0, 2, 1])
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((21, 4), np.float32), rng.standard_normal((21, 8), np.float32)
    w, b = rng.standard_normal((4, 8), np.float32), rng.standard_normal(8, np.float32)
    loss, w2, b2 = step.run([x, y, w, b], [(), (4, 8), (8,)], np.float32)
    z = np.maximum(x @ w + b, 0)
    g = np.where(z > 0, 2 * (z - y) / z.size, 0)
    np.testing.assert_allclose(loss, np.mean((z - y) ** 2), rtol=1e-5)
    np.testing.assert_allclose(w2, w - 0.1 * x.T @ g, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b2, b - 0.1 * g.sum(0), rtol=1e-5, atol=1e-6)


def test_a_wrong_epilogue_is_caught(monkeypatch):
    """The check can fail: an epilogue that ignores the accumulator gives other numbers."""
    rewrite = fusion.epilogue_reads_accumulator

    def broken(op):
        new = rewrite(op)
        block = new.regions[0].blocks[0]
        block.arguments[-1].replace_all_uses_with(block.arguments[0])  # read the bias, not the product
        return new

    monkeypatch.setattr(fusion, "epilogue_reads_accumulator", broken)
    graph = traced("2,8,1", 10, optimized=True)
    with pytest.raises(AssertionError, match="result"):
        check_against_reference(graph, emulated(graph), [10])


def test_exact_gelu_step_matches_the_reference():
    """erf (exact GELU) lowers to libm's on the CPU run of the CUDA schedule."""
    import mlir_nn
    from mlir_nn.engine import Tensor
    from mlir_nn.nn import functional as F

    w = Tensor(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4))

    def step(x):
        y = F.gelu(x @ w)
        y.sum().backward()
        result = [y, w._grad]
        w.grad = None
        return result

    x = np.linspace(-2.0, 2.0, 6, dtype=np.float32).reshape(2, 3)
    graph = mlir_nn.jit(step, backend="numpy").lower(x).optimized_graph
    assert "erf" in {n.op for n in graph.nodes}
    check_against_reference(graph, emulated(graph), [2, 5])
