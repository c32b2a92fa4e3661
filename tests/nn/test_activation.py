"""Activation modules, Flatten and their functional forms against PyTorch in float64 (forward and
gradients to 1e-10), on random shapes including batch 1."""

import numpy as np
import pytest
import torch

from mlir_nn import nn
from mlir_nn.ir import ShapeError
from mlir_nn.nn import functional as F
from tests.nn.torch_twin import assert_same_as_torch

PAIRS = [
    (lambda: nn.ReLU(), lambda: torch.nn.ReLU()),
    (lambda: nn.LeakyReLU(), lambda: torch.nn.LeakyReLU()),
    (lambda: nn.LeakyReLU(0.3), lambda: torch.nn.LeakyReLU(0.3)),
    (lambda: nn.Tanh(), lambda: torch.nn.Tanh()),
    (lambda: nn.Sigmoid(), lambda: torch.nn.Sigmoid()),
    (lambda: nn.GELU(), lambda: torch.nn.GELU()),
    (lambda: nn.GELU(approximate="tanh"), lambda: torch.nn.GELU(approximate="tanh")),
    (lambda: nn.SiLU(), lambda: torch.nn.SiLU()),
    (lambda: nn.Softmax(dim=1), lambda: torch.nn.Softmax(dim=1)),
    (lambda: nn.Softmax(dim=-1), lambda: torch.nn.Softmax(dim=-1)),
    (lambda: nn.LogSoftmax(dim=1), lambda: torch.nn.LogSoftmax(dim=1)),
    (lambda: nn.LogSoftmax(dim=0), lambda: torch.nn.LogSoftmax(dim=0)),
    (lambda: nn.Flatten(), lambda: torch.nn.Flatten()),
    (lambda: nn.Flatten(0, 1), lambda: torch.nn.Flatten(0, 1)),
    (lambda: nn.Identity(), lambda: torch.nn.Identity()),
]
IDS = ["relu", "leaky", "leaky0.3", "tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "softmax1", "softmax-1",
       "logsoftmax1", "logsoftmax0", "flatten", "flatten01", "identity"]


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
@pytest.mark.parametrize("shape", [(1, 3, 2), (4, 5, 3), (2, 1, 7)])
def test_equals_pytorch(pair, shape):
    ours, theirs = pair[0](), pair[1]()
    x = np.random.default_rng(sum(shape)).standard_normal(shape) * 3
    assert_same_as_torch(ours, theirs, x)


def test_softmax_without_dim_picks_pytorchs_legacy_axis():
    for shape in ((5,), (2, 5), (2, 3, 4)):
        x = np.random.randn(*shape)
        with pytest.warns(UserWarning):
            theirs = torch.nn.Softmax()(torch.tensor(x)).numpy()
        np.testing.assert_allclose(nn.Softmax()(x).data, theirs, rtol=1e-12)


def test_functional_forms_and_errors():
    x = np.random.randn(3, 4)
    np.testing.assert_allclose(F.gelu(x).data, torch.nn.functional.gelu(torch.tensor(x)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(F.erf(x).data, torch.erf(torch.tensor(x)).numpy(), rtol=1e-14)
    w, b = np.random.randn(2, 4), np.random.randn(2)
    np.testing.assert_allclose(F.linear(x, nn.Parameter(w), nn.Parameter(b)).data, x @ w.T + b, rtol=1e-14)
    assert F.flatten(np.ones((2, 3, 4)), 1).shape == (2, 12) and F.flatten(np.ones(())).shape == (1,)
    with pytest.raises(ValueError, match="GELU: approximate must be 'none' or 'tanh', got 'fast'"):
        nn.GELU("fast")
    with pytest.raises(ValueError, match="gelu: approximate"):
        F.gelu(x, "fast")
    with pytest.raises(ShapeError, match=r"flatten: start_dim 1 comes after end_dim 0 for shape \(3, 4\)"):
        F.flatten(x, 1, 0)
