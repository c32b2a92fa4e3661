"""Sums over large batches stay accurate: float32 reductions accumulate in float64 on the CPU."""

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step

ROWS = 2_000_000


@pytest.fixture(scope="module")
def big_batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((ROWS, 2)).astype(np.float32), rng.standard_normal((ROWS, 1)).astype(np.float32)


def float64_loss(model, x, y):
    w0, b0, w1, b1 = (p.data.astype(np.float64) for p in model.parameters())
    pred = np.maximum(x.astype(np.float64) @ w0 + b0, 0) @ w1 + b1
    return np.mean((pred - y) ** 2)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_float32_loss_of_two_million_rows_is_within_1e_6(backend, big_batch):
    x, y = big_batch
    model = MLP(2, [16, 1])
    truth = float64_loss(model, x, y)
    loss = jit(lambda x, y: mse_loss(model(x), y), backend=backend)(x, y)
    assert loss.dtype == np.float32
    assert abs(float(loss) - truth) / truth <= 1e-6  # a float32 running sum was 1.3e-3 off


def test_a_training_steps_loss_and_bias_gradient_are_accurate(big_batch):
    x, y = big_batch
    model = MLP(2, [8, 1])
    truth = float64_loss(model, x, y)
    w1, b1 = (p.data.astype(np.float64) for p in model.parameters()[2:])
    pred = np.maximum(x.astype(np.float64) @ model.parameters()[0].data + model.parameters()[1].data, 0) @ w1 + b1
    bias_grad = np.mean(2 * (pred - y))
    before = float(model.parameters()[3].data[0])
    loss = jit(train_step(model, SGD(model.parameters(), lr=1.0)))(x, y)
    assert abs(float(loss) - truth) / truth <= 1e-6
    assert abs((before - float(model.parameters()[3].data[0])) - bias_grad) <= 1e-6 * max(1.0, abs(bias_grad))


def test_a_convolutions_bias_gradient_sums_lanes_in_float64_and_stays_accurate():
    """A sum over batch, rows and pixels per channel: its float64 adds may be reassociated with
    the sign of zero ignored (without nsz, LLVM left the unrolled add chain of each 32-pixel row
    scalar), and the result still matches the float64 sum."""
    from mlir_nn.backends import get_backend
    from mlir_nn.codegen import emit_linalg
    from mlir_nn.ir import Graph, make_node

    g = make_node("input", [], name="g", shape=("N", 8, 7, 32), dtype="float32")
    total = make_node("sum", [g], axes=(0, 2, 3), keepdims=False)
    graph = Graph((g,), (), (total,), name="bias_grad")
    assert "fastmath<reassoc,nsz>" in str(emit_linalg(graph, wide_sums=True))
    data = np.random.default_rng(0).standard_normal((33, 8, 7, 32)).astype(np.float32) + 1e3
    (got,) = get_backend("cpu").compile(graph).run([data], [])
    want = data.astype(np.float64).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(got, want, rtol=2e-7)
