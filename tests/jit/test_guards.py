"""Structural changes after the first call re-trace; nothing is silently ignored."""

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.engine import Tensor
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP, Layer, Module
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step

BACKENDS = ["numpy", "cpu"]


def data(rows=4, nin=2, nout=1, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, nin)).astype(np.float32), rng.standard_normal((rows, nout)).astype(np.float32)


def eager_copy(model, opt_cls, **opt_args):
    twin = MLP(model.layers[0].nin, [layer.nout for layer in model.layers])
    for a, b in zip(model.parameters(), twin.parameters()):
        b.data[...] = a.data
    return twin, opt_cls(twin.parameters(), **opt_args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replacing_a_weight_tensor_retraces(backend):
    model = MLP(2, [3, 1])
    step = jit(train_step(model, SGD(model.parameters(), lr=0.1)), backend=backend)
    x, y = data()
    step(x, y)
    old = model.layers[0].W
    kept = old.data.copy()
    model.layers[0].W = Tensor(np.zeros((2, 3)), dtype=np.float32)
    step(x, y)
    np.testing.assert_array_equal(old.data, kept)  # the replaced tensor is no longer trained
    assert model.layers[0].W is step.lower(x, y).captured[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_adding_a_layer_retraces(backend):
    model = MLP(2, [3, 1])
    opt = SGD(model.parameters(), lr=0.1)

    @jit(backend=backend)
    def forward(x):
        return model(x)

    x, _ = data()
    assert forward(x).shape == (4, 1)
    model.layers.append(Layer(1, 5, nonlin=False))
    assert forward(x).shape == (4, 5)
    assert opt.parameters  # the optimizer is not part of this step


@pytest.mark.parametrize("backend", BACKENDS)
def test_replacing_the_optimizer_retraces(backend):
    model = MLP(2, [3, 1])
    twin, eager_opt = eager_copy(model, Adam, lr=0.01)
    opt = SGD(model.parameters(), lr=0.1)

    def step(x, y):
        loss = mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    compiled = jit(step, backend=backend)
    x, y = data()
    compiled(x, y)
    train_step(twin, SGD(twin.parameters(), lr=0.1))(Tensor(x), Tensor(y))
    opt = Adam(model.parameters(), lr=0.01)  # rebinding the name the step reads
    compiled(x, y)
    train_step(twin, eager_opt)(Tensor(x), Tensor(y))
    for a, b in zip(twin.parameters(), model.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clearing_optimizer_state_restarts_momentum(backend):
    model = MLP(2, [3, 1])
    twin, eager_opt = eager_copy(model, SGD, lr=0.1, momentum=0.9)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = jit(train_step(model, opt), backend=backend)
    eager = train_step(twin, eager_opt)
    x, y = data()
    for clear in (False, True, False):
        if clear:
            opt.state.clear()
            eager_opt.state.clear()
        step(x, y)
        eager(Tensor(x), Tensor(y))
    for a, b in zip(twin.parameters(), model.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-5, atol=1e-6)


def test_an_unchanged_structure_keeps_the_compiled_step():
    model = MLP(2, [3, 1])
    opt = SGD(model.parameters(), lr=0.1, momentum=0.5)
    step = jit(train_step(model, opt), backend="numpy")
    x, y = data()
    step(x, y)
    compiled = step.lower(x, y)
    opt.lr, opt.momentum = 0.2, 0.7
    step(x, y)
    assert step.lower(x, y) is compiled
    opt.momentum = 0.0  # zero momentum is structural: no buffer in the step
    step(x, y)
    assert step.lower(x, y) is not compiled


class Holder:
    """A plain object holding a weight: changes to it are not reported to the guard."""

    def __init__(self, W):
        self.W = W


class HeldWeights(Module):
    """A user-defined module whose parameters() reads a plain object: checked on every call."""

    def __init__(self):
        self.store = Holder(Tensor(np.ones((2, 1)), dtype=np.float32))

    def __call__(self, x):
        return x @ self.store.W

    def parameters(self):
        return [self.store.W]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_module_computing_its_parameters_its_own_way_is_checked_on_every_call(backend):
    model = HeldWeights()
    assert not model.structure_tracked()
    forward = jit(lambda x: model(x), backend=backend)
    x, _ = data()
    np.testing.assert_allclose(forward(x), x.sum(axis=1, keepdims=True), rtol=1e-6)
    model.store.W = Tensor(np.full((2, 1), 2.0), dtype=np.float32)  # no Module.__setattr__ involved
    np.testing.assert_allclose(forward(x), 2 * x.sum(axis=1, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("change", ["setitem", "insert", "pop", "state_setitem", "slot_setitem", "momentum"])
def test_every_tracked_change_retraces(change):
    model = MLP(2, [3, 1])
    opt = SGD(model.parameters(), lr=0.1, momentum=0.5)
    step = jit(train_step(model, opt), backend="numpy")
    x, y = data()
    step(x, y)
    assert model.structure_tracked() and opt.structure_tracked()
    first = step.lower(x, y)
    if change == "setitem":
        model.layers[1] = Layer(3, 1, nonlin=False)
    elif change == "insert":
        model.layers.insert(1, Layer(3, 3))
    elif change == "pop":
        model.layers.pop(0)
        model.layers.insert(0, Layer(2, 3))
    elif change == "state_setitem":
        opt.state[id(model.layers[0].W)] = {"momentum_buffer": Tensor(np.zeros((2, 3)), dtype=np.float32)}
    elif change == "slot_setitem":
        opt.state[id(model.layers[0].W)]["momentum_buffer"] = Tensor(np.zeros((2, 3)), dtype=np.float32)
    elif change == "momentum":
        opt.momentum = 0.0
    step(x, y)
    assert step.lower(x, y) is not first


def test_an_unchanged_tracked_structure_skips_the_key_comparison(monkeypatch):
    model = MLP(2, [3, 1])
    opt = SGD(model.parameters(), lr=0.1)
    step = jit(train_step(model, opt), backend="numpy")
    x, y = data()
    step(x, y)
    calls = []
    monkeypatch.setattr(MLP, "structure_key", lambda self: calls.append(self) or Module.structure_key(self))
    for lr in (0.05, 0.02):
        opt.lr = lr  # a hyperparameter value is not structure
        step(x, y)
    assert calls == []
    model.layers[0].W = Tensor(np.zeros((2, 3)), dtype=np.float32)
    step(x, y)
    assert calls  # compared again after a change


def test_a_plain_list_of_layers_keeps_its_identity_and_is_checked_on_every_call():
    model = MLP(2, [3, 1])
    layers = list(model.layers)
    model.layers = layers  # a plain list: the model holds this very list
    assert model.layers is layers and not model.structure_tracked()

    @jit(backend="numpy")
    def forward(x):
        return model(x)

    x, _ = data()
    assert forward(x).shape == (4, 1)
    layers.append(Layer(1, 5, nonlin=False))  # reported by nothing
    assert forward(x).shape == (4, 5)
