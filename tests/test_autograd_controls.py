"""Autograd controls with PyTorch's names: no_grad, detach, requires_grad, item, __array__,
in-place updates of parameters, and reading p.grad inside a traced step."""

import numpy as np
import pytest

import mlir_nn
from mlir_nn.engine import Tensor


def test_no_grad_records_nothing_and_restores_the_mode():
    x = Tensor(np.array([1.0, 2.0]))
    with mlir_nn.no_grad():
        assert not mlir_nn.is_grad_enabled()
        y = x * 3
        with mlir_nn.enable_grad():
            z = x * 3
    assert mlir_nn.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf
    assert z.requires_grad and not z.is_leaf

    @mlir_nn.no_grad()
    def double(t):
        return t * 2

    assert not double(x).requires_grad and mlir_nn.is_grad_enabled()


def test_detach_shares_values_and_stops_gradients():
    x = Tensor(np.array([1.0, -2.0]))
    d = x.detach()
    assert not d.requires_grad and d.data is x.data
    (x * d).sum().backward()
    np.testing.assert_array_equal(x.grad, x.data)  # d is a constant: d/dx (x * d) = d


def test_requires_grad_false_gets_no_gradient():
    a, b = Tensor(np.array([1.0, 2.0])), Tensor(np.array([3.0, 4.0]))
    assert b.requires_grad_(False) is b and not b.requires_grad
    (a * b).sum().backward()
    np.testing.assert_array_equal(a.grad, [3.0, 4.0])
    np.testing.assert_array_equal(b.grad, [0.0, 0.0])
    assert not (b * 2).requires_grad


def test_item_float_int_bool_and_numpy_see_the_numbers():
    t = Tensor(np.array([[2.5]]))
    assert t.item() == 2.5 and isinstance(t.item(), float)
    assert float(t) == 2.5 and int(t) == 2 and bool(t)
    x = Tensor(np.array([1.0, 2.0], np.float32))
    a = np.asarray(x)
    assert a.dtype == np.float32 and a.tolist() == [1.0, 2.0]
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert isinstance(np.ones(2) + x, Tensor)  # numpy operands still defer to the tensor
    with pytest.raises(ValueError, match=r"item: tensor \(2,\) has 2 elements; expected exactly one"):
        x.item()
    with pytest.raises(ValueError, match=r"bool\(\) of a tensor with 2 elements \(2,\) is ambiguous"):
        bool(x)


def test_in_place_updates_of_parameters():
    w = Tensor(np.array([1.0, 2.0]))
    array = w.data
    (w * w).sum().backward()
    with mlir_nn.no_grad():
        w -= 0.25 * w.grad
        w *= 2
    assert w.data is array  # in place: compiled steps holding the array see it
    np.testing.assert_array_equal(w.data, [1.0, 2.0])
    with pytest.raises(RuntimeError, match="in-place sub of a tensor .* a leaf that requires grad.*no_grad"):
        w -= 1.0
    c = w + 1  # a computed tensor is rebound, as in micrograd
    c += 1
    np.testing.assert_array_equal(c.data, [3.0, 4.0])
    np.testing.assert_array_equal(w.data, [1.0, 2.0])


def _manual_sgd(w, b, lr):
    def step(x, y):
        loss = ((x * w + b - y) ** 2).mean()
        loss.backward()
        with mlir_nn.no_grad():
            for p in (w,):
                p -= lr * p.grad          # the tutorials' update, traced as a parameter update
            b.data -= lr * b.grad         # and through .data
            w.grad = None
            b.grad = None
        return loss
    return step


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_the_manual_update_under_no_grad_compiles(backend):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(8), rng.standard_normal(8)
    eager = [Tensor(np.array([0.5])), Tensor(np.array([-0.2]))]
    traced = [Tensor(t.data.copy()) for t in eager]
    eager_step, compiled = _manual_sgd(*eager, 0.1), mlir_nn.jit(_manual_sgd(*traced, 0.1), backend=backend,
                                                                  tiered=False)
    for _ in range(3):
        want = eager_step(Tensor(x), Tensor(y))
        got = compiled(x, y)
        np.testing.assert_allclose(got, want.data, rtol=1e-12)
    for e, t in zip(eager, traced):
        np.testing.assert_allclose(t.data, e.data, rtol=1e-12)
    assert compiled.lower(x, y).graph.updates  # updated in the step, not frozen


def test_p_grad_inside_a_step_is_the_traced_gradient():
    w = Tensor(np.array([1.0, 2.0, 3.0]))

    @mlir_nn.jit(backend="numpy", dynamic_batch=False)
    def grad_of(x):
        (x * w * w).sum().backward()
        return w.grad

    np.testing.assert_allclose(grad_of(np.ones(3)), 2 * w.data)
    np.testing.assert_allclose(grad_of(np.full(3, 2.0)), 4 * w.data)
