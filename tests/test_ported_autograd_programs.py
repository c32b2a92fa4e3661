"""Well-known PyTorch programs ported by changing their imports, compared with the same
programs in PyTorch (float64, same initial weights, same data): losses and parameters to 1e-10.

* "Learning PyTorch with Examples": the polynomial fit with autograd and a manual update
  under no_grad, and the dynamic net (depth drawn with Python's ``random`` in forward),
  which jit must refuse with a clear error instead of freezing one depth.
* micrograd's demo: an MLP on two moons with the max-margin loss, L2 regularisation and a
  decaying learning rate, updated by hand through ``p.data -= lr * p.grad``.
"""

import math
import random

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn, optim
from mlir_nn.engine import Tensor

TOL = dict(rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------- polynomial fit


def _polynomial_data():
    x = np.linspace(-math.pi, math.pi, 200)
    return x, np.sin(x)


def _polynomial_torch(start, steps, lr):
    x, y = (torch.tensor(v) for v in _polynomial_data())
    a, b, c, d = (torch.tensor(v, requires_grad=True) for v in start)
    losses = []
    for _ in range(steps):
        y_pred = a + b * x + c * x ** 2 + d * x ** 3
        loss = (y_pred - y).pow(2).sum()
        losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            for p in (a, b, c, d):
                p -= lr * p.grad
                p.grad = None
    return losses, [p.item() for p in (a, b, c, d)]


def _polynomial_ours(start, steps, lr, backend):
    a, b, c, d = (Tensor(v) for v in start)

    def step(x, y):
        y_pred = a + b * x + c * x ** 2 + d * x ** 3
        loss = ((y_pred - y) ** 2).sum()
        loss.backward()
        with mlir_nn.no_grad():
            for p in (a, b, c, d):
                p -= lr * p.grad
                p.grad = None
        return loss

    run = mlir_nn.jit(step, backend=backend, tiered=False) if backend else step
    x, y = _polynomial_data()
    losses = [float(run(x, y) if backend else run(Tensor(x), Tensor(y))) for _ in range(steps)]
    return losses, [p.item() for p in (a, b, c, d)]


@pytest.mark.parametrize("backend", [None, "cpu"])
def test_polynomial_fit_with_a_manual_update_equals_pytorch(backend):
    start = np.random.default_rng(0).standard_normal(4)
    ours, theirs = _polynomial_ours(start, 40, 1e-5, backend), _polynomial_torch(start, 40, 1e-5)
    np.testing.assert_allclose(ours[0], theirs[0], **TOL)
    np.testing.assert_allclose(ours[1], theirs[1], **TOL)
    assert ours[0][-1] < ours[0][0] / 2


# ---------------------------------------------------------------------------- dynamic net


class DynamicNet(nn.Module):
    def __init__(self, start):
        super().__init__()
        self.a, self.b, self.c, self.d, self.e = (nn.Parameter(v) for v in start)

    def forward(self, x):
        y = self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3
        for exp in range(4, random.randint(4, 6)):
            y = y + self.e * x ** exp
        return y


class TorchDynamicNet(torch.nn.Module):
    def __init__(self, start):
        super().__init__()
        self.a, self.b, self.c, self.d, self.e = (torch.nn.Parameter(torch.tensor(v)) for v in start)

    def forward(self, x):
        y = self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3
        for exp in range(4, random.randint(4, 6)):
            y = y + self.e * x ** exp
        return y


def _dynamic_torch(start, steps):
    x, y = (torch.tensor(v) for v in _polynomial_data())
    model = TorchDynamicNet(start)
    criterion = torch.nn.MSELoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-8, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = criterion(model(x), y)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return losses, [p.item() for p in model.parameters()]


def _dynamic_step(start):
    model = DynamicNet(start)
    criterion = nn.MSELoss(reduction="sum")
    optimizer = optim.SGD(model.parameters(), lr=1e-8, momentum=0.9)

    def step(x, y):
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, step


def test_dynamic_net_runs_eagerly_as_pytorch():
    start = np.random.default_rng(1).standard_normal(5) * 0.1
    random.seed(0)
    theirs = _dynamic_torch(start, 15)
    random.seed(0)
    model, step = _dynamic_step(start)
    x, y = _polynomial_data()
    losses = [step(Tensor(x), Tensor(y)).item() for _ in range(15)]
    np.testing.assert_allclose(losses, theirs[0], **TOL)
    np.testing.assert_allclose([p.item() for p in model.parameters()], theirs[1], **TOL)


def test_dynamic_net_under_jit_is_a_clear_error_not_a_frozen_depth():
    _, step = _dynamic_step(np.full(5, 0.1))
    with pytest.raises(mlir_nn.PythonRandomError) as info:
        mlir_nn.jit(step, backend="numpy")(*_polynomial_data())
    message = str(info.value)
    assert __file__ in message and "random.randint(4, 6)" in message and "frozen" in message


# ---------------------------------------------------------------------------- micrograd's demo


def _moons():
    from sklearn.datasets import make_moons

    X, y = make_moons(n_samples=100, noise=0.1, random_state=1)
    return X, (y * 2 - 1).astype(np.float64)


def _micrograd_torch(weights, steps):
    X, y = (torch.tensor(v) for v in _moons())
    params = [torch.tensor(w, requires_grad=True) for w in weights]
    losses = []
    for k in range(steps):
        h = X
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            h = h.relu() if i < len(params) - 2 else h
        scores = h.reshape(-1)
        data_loss = (1 + -y * scores).relu().mean()
        loss = data_loss + 1e-4 * sum((p * p).sum() for p in params)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.data -= (1.0 - 0.9 * k / 100) * p.grad
        losses.append(loss.item())
    return losses, [p.detach().numpy() for p in params]


def _micrograd_ours(model, steps, backend):
    X, y = _moons()

    def step(X, y, learning_rate):
        scores = model(X).reshape(-1)
        data_loss = (1 + -y * scores).relu().mean()
        loss = data_loss + 1e-4 * sum((p * p).sum() for p in model.parameters())
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= learning_rate * p.grad
        return loss, scores

    run = mlir_nn.jit(step, backend=backend, tiered=False, dynamic_batch=False) if backend else step
    losses = []
    for k in range(steps):
        learning_rate = np.array(1.0 - 0.9 * k / 100)  # an input of the step, so it is not frozen
        loss, scores = run(X, y, learning_rate) if backend else run(Tensor(X), Tensor(y), Tensor(learning_rate))
        losses.append(float(np.asarray(loss)))
    accuracy = np.mean((y > 0) == (np.asarray(scores) > 0))
    return losses, [p.data for p in model.parameters()], accuracy


@pytest.mark.parametrize("backend", [None, "cpu"])
def test_micrograd_demo_equals_pytorch(backend):
    mlir_nn.manual_seed(1337)
    model = nn.MLP(2, [16, 16, 1], dtype=np.float64)
    weights = [p.data.copy() for p in model.parameters()]
    losses, params, accuracy = _micrograd_ours(model, 20, backend)
    want_losses, want_params = _micrograd_torch(weights, 20)
    np.testing.assert_allclose(losses, want_losses, **TOL)
    for got, want in zip(params, want_params):
        np.testing.assert_allclose(got, want, **TOL)
    assert losses[-1] < losses[0] and accuracy > 0.8
