"""Dropout: PyTorch's scaling, masks reproducible by seed, fresh per call, identical eagerly and in
compiled steps on every backend without recompiling; identity in eval mode."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.nn import functional as F


def test_scaling_and_gradient_are_pytorchs():
    mlir_nn.manual_seed(0)
    x = np.random.randn(40, 30)
    xs = Tensor(x)
    out = F.dropout(xs, 0.3)
    kept = out.data != 0
    assert 0.6 < kept.mean() < 0.8
    xt = torch.tensor(x, requires_grad=True)
    theirs = xt * torch.tensor(kept.astype(np.float64)) * (1 / (1 - 0.3))  # PyTorch's x * mask / (1 - p)
    np.testing.assert_array_equal(out.data, theirs.detach().numpy())
    out.sum().backward()
    theirs.sum().backward()
    np.testing.assert_array_equal(xs.grad, xt.grad.numpy())


def test_seeded_reproducible_and_fresh_per_call():
    x = np.ones((8, 9))
    mlir_nn.manual_seed(5)
    a, b = F.dropout(x).data, F.dropout(x).data
    mlir_nn.manual_seed(5)
    np.testing.assert_array_equal(F.dropout(x).data, a)
    np.testing.assert_array_equal(F.dropout(x).data, b)
    assert not np.array_equal(a, b)
    mlir_nn.manual_seed(6)
    assert not np.array_equal(F.dropout(x).data, a)


def test_eval_mode_p_zero_and_one_and_bad_p():
    x = Tensor(np.random.randn(3, 4))
    drop = nn.Dropout(0.5)
    assert drop.eval()(x) is x and F.dropout(x, 0.0) is x and F.dropout(x, 0.9, training=False) is x
    np.testing.assert_array_equal(F.dropout(x, 1.0).data, np.zeros((3, 4)))
    with pytest.raises(ValueError, match="Dropout: probability has to be between 0 and 1, but got 1.5"):
        nn.Dropout(1.5)
    with pytest.raises(ValueError, match="dropout: probability has to be between 0 and 1, but got -0.1"):
        F.dropout(x, -0.1)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_masks_equal_eager_ones_and_change_each_call_without_recompiling(backend, dtype):
    model = nn.Sequential(nn.Dropout(0.4), nn.Linear(6, 5, dtype=dtype), nn.Dropout(0.2))
    step = mlir_nn.jit(lambda x: model(x), backend=backend)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((b, 6)).astype(dtype) for b in (4, 1, 4)]
    mlir_nn.manual_seed(11)
    compiled = [step(x) for x in xs]
    first = step.lower(xs[0])
    mlir_nn.manual_seed(11)
    eager = [model(x).data for x in xs]
    tol = 1e-6 if dtype == np.float32 else 1e-13
    for c, e in zip(compiled, eager):
        np.testing.assert_allclose(c, e, rtol=tol, atol=tol)
        np.testing.assert_array_equal(c == 0, e == 0)
    assert not np.array_equal(compiled[0] == 0, compiled[2] == 0)
    mlir_nn.manual_seed(11)  # the seed is a run-time input too
    np.testing.assert_allclose(step(xs[0]), eager[0], rtol=tol, atol=tol)
    assert step.lower(xs[0]) is first
    model.eval()
    np.testing.assert_allclose(step(xs[0]), model[1](xs[0]).data, rtol=tol, atol=tol)
