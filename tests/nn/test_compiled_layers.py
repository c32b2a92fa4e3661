"""Every layer inside one compiled training step (numpy and cpu backends) equals the same step run
eagerly: losses, parameters and buffers (BatchNorm's running statistics updated in the step)."""

import numpy as np
import pytest

import mlir_nn
from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.losses import mse_loss
from mlir_nn.optim import SGD


def make_model():
    np.random.seed(7)
    f64 = np.float64
    return nn.Sequential(
        nn.Linear(5, 8, dtype=f64), nn.BatchNorm1d(8, dtype=f64), nn.GELU(), nn.Dropout(0.25),
        nn.Linear(8, 6, dtype=f64), nn.LayerNorm(6, dtype=f64), nn.LeakyReLU(0.1), nn.SiLU(),
        nn.Linear(6, 4, dtype=f64), nn.GELU("tanh"), nn.Tanh(), nn.Flatten(), nn.LogSoftmax(dim=1),
    )


def step_of(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_compiled_training_equals_eager(backend):
    eager_model, model = make_model(), make_model()
    eager = step_of(eager_model, SGD(eager_model.parameters(), lr=0.1, momentum=0.9))
    compiled = mlir_nn.jit(step_of(model, SGD(model.parameters(), lr=0.1, momentum=0.9)), backend=backend)
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((b, 5)), rng.standard_normal((b, 4))) for b in (6, 3, 6)]
    mlir_nn.manual_seed(2)
    losses = [compiled(x, y) for x, y in batches]
    mlir_nn.manual_seed(2)
    expected = [eager(Tensor(x), Tensor(y)).data for x, y in batches]
    np.testing.assert_allclose(losses, expected, rtol=1e-10)
    ours, theirs = model.state_dict(), eager_model.state_dict()
    assert ours["1.num_batches_tracked"] == 3
    for key in theirs:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-10, atol=1e-12, err_msg=key)
    model.eval()
    eager_model.eval()
    x = batches[0][0][:1]  # batch 1: running statistics, no dropout
    forward = mlir_nn.jit(lambda x: model(x), backend=backend)
    np.testing.assert_allclose(forward(x), eager_model(x).data, rtol=1e-10)
