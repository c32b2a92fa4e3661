"""nn.Linear and nn.Identity against PyTorch in float64; compiled training steps against eager ones."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.losses import mse_loss
from mlir_nn.optim import SGD
from tests.nn.torch_twin import assert_same_as_torch


@pytest.mark.parametrize("batch,nin,nout,bias", [(1, 1, 1, True), (5, 3, 7, True), (4, 6, 2, False)])
def test_linear_equals_pytorch(batch, nin, nout, bias):
    ours = nn.Linear(nin, nout, bias=bias, dtype=np.float64)
    assert ours.weight.shape == (nout, nin)
    assert_same_as_torch(ours, torch.nn.Linear(nin, nout, bias=bias), np.random.randn(batch, nin))
    assert_same_as_torch(nn.Linear(nin, nout, bias=bias, dtype=np.float64), torch.nn.Linear(nin, nout, bias=bias),
                         np.random.randn(nin))


@pytest.mark.parametrize("shape", [(2, 3, 4), (1, 1, 2, 4)])
def test_linear_on_more_dimensions_equals_pytorch(shape):
    assert_same_as_torch(nn.Linear(4, 3, dtype=np.float64), torch.nn.Linear(4, 3), np.random.randn(*shape))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_linear_on_more_dimensions_compiles(backend):
    layer = nn.Linear(4, 3, dtype=np.float64)
    x = np.random.randn(2, 5, 4)
    static = mlir_nn.jit(lambda x: layer(x), backend=backend, dynamic_batch=False)
    np.testing.assert_allclose(static(x), layer(x).data, rtol=1e-12)
    dynamic = mlir_nn.jit(lambda x: layer(x), backend=backend)
    np.testing.assert_allclose(dynamic(x[:, :1]), layer(x[:, :1]).data, rtol=1e-12)  # (N, 1, 4): batch kept
    with pytest.raises(ShapeError, match="linear: input .* traced batch dimension among others"):
        dynamic(x)


def test_linear_init_is_pytorchs_and_errors_are_clear():
    layer = nn.Linear(100, 300)
    bound = 1 / np.sqrt(100)
    for p in (layer.weight, layer.bias):
        assert p.dtype == "float32" and bound * 0.95 < np.abs(p.data).max() <= bound
    assert repr(layer) == "Linear(in_features=100, out_features=300, bias=True)"
    with pytest.raises(ShapeError, match=r"Linear: input has shape \(2, 4\), expected \(\*, 3\)"):
        nn.Linear(3, 1)(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="Linear: out_features must be a positive int, got 0"):
        nn.Linear(3, 0)
    x = Tensor(np.ones(2))
    assert nn.Identity(5, any=1)(x) is x


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_compiled_sequential_step_equals_the_eager_one(backend):
    def make():
        np.random.seed(4)
        model = nn.Sequential(nn.Linear(3, 8, dtype=np.float64), nn.Identity(), nn.Linear(8, 2, dtype=np.float64))
        return model, SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step_of(model, opt):
        def step(x, y):
            opt.zero_grad()
            loss = mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return step

    eager_model, eager_opt = make()
    model, opt = make()
    eager, compiled = step_of(eager_model, eager_opt), mlir_nn.jit(step_of(model, opt), backend=backend)
    rng = np.random.default_rng(0)
    for batch in (5, 1, 5):
        x, y = rng.standard_normal((batch, 3)), rng.standard_normal((batch, 2))
        np.testing.assert_allclose(compiled(x, y), eager(Tensor(x), Tensor(y)).data, rtol=1e-10)
    for a, b in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-10, atol=1e-12)
