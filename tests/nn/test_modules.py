"""The tensor MLP against a scalar engine written in the seed's style."""

import math
import random

import numpy as np
import pytest

from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP, Layer


class Scalar:
    """tinynn's Value, reduced to what an MLP with MSE needs (float64 throughout)."""

    def __init__(self, data, children=()):
        self.data, self.grad, self._prev, self._backward = float(data), 0.0, children, lambda: None

    def __add__(self, other):
        other = other if isinstance(other, Scalar) else Scalar(other)
        out = Scalar(self.data + other.data, (self, other))

        def backward():
            self.grad += out.grad
            other.grad += out.grad

        out._backward = backward
        return out

    def __mul__(self, other):
        other = other if isinstance(other, Scalar) else Scalar(other)
        out = Scalar(self.data * other.data, (self, other))

        def backward():
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad

        out._backward = backward
        return out

    def __sub__(self, other):
        return self + other * -1.0

    def relu(self):
        out = Scalar(max(self.data, 0.0), (self,))

        def backward():
            self.grad += (out.data > 0) * out.grad

        out._backward = backward
        return out

    def backward(self):
        topo, seen = [], set()

        def visit(v):
            if v not in seen:
                seen.add(v)
                for c in v._prev:
                    visit(c)
                topo.append(v)

        visit(self)
        self.grad = 1.0
        for v in reversed(topo):
            v._backward()


def scalar_mlp_loss(weights, X, Y):
    """Per-sample loops exactly like tinynn; returns (loss, scalar parameters)."""
    params = [[[Scalar(w) for w in row] for row in W] if W.ndim == 2 else [Scalar(b) for b in W] for W in weights]
    total = Scalar(0.0)
    for x, y in zip(X, Y):
        act = [Scalar(v) for v in x]
        for i in range(0, len(params), 2):
            W, b = params[i], params[i + 1]
            out = []
            for j in range(len(b)):
                z = b[j]
                for k in range(len(act)):
                    z = z + W[k][j] * act[k]
                out.append(z.relu() if i + 2 < len(params) else z)
            act = out
        for o, t in zip(act, y):
            d = o - t
            total = total + d * d
    loss = total * (1.0 / (len(X) * len(Y[0])))
    return loss, params


@pytest.mark.parametrize("sizes,batch", [([2, 8, 8, 1], 5), ([3, 4, 2], 1), ([1, 1, 1], 3)])
def test_mlp_gradients_match_the_scalar_engine(sizes, batch):
    np.random.seed(3)
    model = MLP(sizes[0], sizes[1:], dtype=np.float64)
    X, Y = np.random.randn(batch, sizes[0]), np.random.randn(batch, sizes[-1])
    mse_loss(model(Tensor(X)), Tensor(Y)).backward()
    loss, sparams = scalar_mlp_loss([p.data for p in model.parameters()], X, Y)
    loss.backward()
    for p, sp in zip(model.parameters(), sparams):
        grads = np.array([[s.grad for s in row] for row in sp] if p.ndim == 2 else [s.grad for s in sp])
        np.testing.assert_allclose(p.grad, grads, rtol=1e-5, atol=1e-12)


def test_layer_api_and_parameter_order():
    model = MLP(2, [3, 1])
    params = model.parameters()
    assert [p.shape for p in params] == [(2, 3), (3,), (3, 1), (1,)]
    assert model.layers[0].nonlin and not model.layers[-1].nonlin
    out = model([Tensor(0.5), Tensor(-0.5)])  # tinynn-style list of scalars
    assert out.shape == (1,)
    model.zero_grad()
    assert all(np.all(p.grad == 0) for p in params)


def test_layer_rejects_wrong_width():
    layer = Layer(3, 2)
    with pytest.raises(ShapeError, match=r"Layer: input has shape \(4, 2\), expected \(batch, 3\)"):
        layer(np.ones((4, 2), np.float32))
    random.seed(0)
    assert math.isfinite(float(layer(np.ones((1, 3), np.float32)).sum().data))


def test_default_init_is_pytorchs_and_tinynn_is_offered():
    """Issue 10, defect 8: Kaiming-uniform (nn.Linear's) by default, the seed's U(-1, 1) on request."""
    np.random.seed(0)
    layer = Layer(100, 400)
    bound = 1 / np.sqrt(100)
    for t in (layer.W, layer.b):
        assert np.abs(t.data).max() <= bound and np.abs(t.data).max() > 0.95 * bound
    seed_style = MLP(100, [400], init="tinynn").layers[0]
    assert np.all(seed_style.b.data == 0) and 0.95 < np.abs(seed_style.W.data).max() <= 1
    with pytest.raises(ValueError, match="Layer: unknown init 'xavier'"):
        Layer(2, 2, init="xavier")


def test_a_list_of_values_keeps_its_gradients():
    """Issue 10, defect 7: micrograd's ``model([Value, Value])`` gives the inputs their gradients."""
    np.random.seed(1)
    model = MLP(2, [3, 1], dtype=np.float64)
    xs = [Tensor(0.5), Tensor(-1.5)]
    model(xs).sum().backward()
    x = Tensor(np.array([0.5, -1.5]))
    model.zero_grad()
    model(x).sum().backward()
    np.testing.assert_allclose([v.grad for v in xs], x.grad, rtol=1e-15)
    assert np.any(x.grad != 0)
    xs32 = [Tensor(0.5), Tensor(-1.5)]  # float64 Values into a float32 model: cast, gradients flow back
    MLP(2, [3, 1])(xs32).sum().backward()
    assert xs32[0].grad.dtype == np.float64 and np.any([v.grad != 0 for v in xs32])


def test_state_dict_names_shapes_and_round_trip():
    model = MLP(2, [3, 1])
    state = model.state_dict()
    assert list(state) == ["layers.0.W", "layers.0.b", "layers.1.W", "layers.1.b"]
    assert [v.shape for v in state.values()] == [p.shape for p in model.parameters()]
    other = MLP(2, [3, 1])
    other.load_state_dict(state)
    for a, b in zip(model.parameters(), other.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    state["layers.0.W"][...] = 7  # a copy: the model is untouched
    assert not np.any(model.layers[0].W.data == 7)


def test_load_state_dict_checks_everything_before_writing():
    model = MLP(2, [3, 1])
    before = [p.data.copy() for p in model.parameters()]
    bad = model.state_dict()
    bad["layers.1.W"] = np.zeros((4, 1))
    with pytest.raises(ShapeError, match=r"layers.1.W has shape \(4, 1\), expected \(3, 1\)"):
        model.load_state_dict(bad)
    with pytest.raises(KeyError, match=r"missing keys \['layers.1.b'\], unexpected keys \['extra'\]"):
        model.load_state_dict({**{k: v for k, v in model.state_dict().items() if k != "layers.1.b"}, "extra": 1})
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


@pytest.mark.parametrize("value,match", [
    (1e40, "must hold finite float32 numbers; it has NaN, infinity or values beyond float32's range"),
    (np.nan, "must hold finite float32 numbers"),
    ("a", "must be numeric"),
])
def test_load_state_dict_checks_values_in_the_parameters_dtype(value, match):
    model = MLP(2, [3, 1])
    before = [p.data.copy() for p in model.parameters()]
    state = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    state["layers.1.W"] = np.full((3, 1), value)
    with pytest.raises((TypeError, ValueError), match=match):
        model.load_state_dict(state)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


def test_float64_data_into_a_float32_model_names_the_layer_not_astype():
    from mlir_nn import jit
    from mlir_nn.ir import DTypeError

    model = MLP(2, [3, 1])
    step = jit(lambda x: model(x).sum(), backend="numpy")
    with pytest.raises(DTypeError, match=r"Layer: the input is float64, the layer's weights are float32; .*"
                                         r"X.astype\(np.float32\)"):
        step(np.ones((4, 2)))
