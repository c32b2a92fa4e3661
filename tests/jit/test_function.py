"""jit: one trace per signature, dynamic batch, in-place state, errors before execution."""

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam


def make_step(model, opt):
    def step(x, y):
        pred = model(x)
        loss = mse_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss, pred

    return step


@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_jitted_steps_equal_eager_steps(opt_cls):
    np.random.seed(1)
    eager_model = MLP(3, [5, 4, 2], dtype=np.float64)
    jit_model = MLP(3, [5, 4, 2], dtype=np.float64)
    for a, b in zip(eager_model.parameters(), jit_model.parameters()):
        b.data[...] = a.data
    eager = make_step(eager_model, opt_cls(eager_model.parameters(), lr=0.01))
    compiled = jit(make_step(jit_model, opt_cls(jit_model.parameters(), lr=0.01)))
    for batch in (4, 4, 1, 7):
        x, y = np.random.randn(batch, 3), np.random.randn(batch, 2)
        eager_loss, _ = eager(Tensor(x), Tensor(y))
        loss, pred = compiled(x, y)
        assert pred.shape == (batch, 2)
        np.testing.assert_allclose(loss, eager_loss.data, rtol=1e-12)
    for a, b in zip(eager_model.parameters(), jit_model.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-12)
    assert len(compiled._cache) == 1, "every batch size must share one trace"


def test_state_is_read_each_call_and_updated_in_place():
    w = Tensor(np.ones(3))

    @jit
    def step(x):
        w.assign(w + x.sum(axis=0))
        return w.sum()

    buffer = w.data
    step(np.ones((2, 3)))
    assert w.data is buffer
    np.testing.assert_array_equal(buffer, 3 * np.ones(3))
    buffer[...] = 0  # writes into p.data are honoured
    assert step(np.ones((1, 3))) == 3.0


def test_grads_of_outside_tensors_are_left_alone():
    model = MLP(2, [1], dtype=np.float64)
    model.parameters()[0].grad = np.full((2, 1), 7.0)
    step = jit(make_step(model, SGD(model.parameters(), lr=0.1)))
    step(np.ones((3, 2)), np.ones((3, 1)))
    np.testing.assert_array_equal(model.parameters()[0].grad, np.full((2, 1), 7.0))


def test_new_signature_retraces():
    model = MLP(2, [1], dtype=np.float64)
    step = jit(make_step(model, SGD(model.parameters(), lr=0.1)))
    step(np.ones((3, 2)), np.ones((3, 1)))
    with pytest.raises(ShapeError, match=r"Layer: input has shape \(N, 3\), expected \(batch, 2\)"):
        step(np.ones((3, 3)), np.ones((3, 1)))


@pytest.mark.parametrize("x,y,error,match", [
    (np.ones((4, 2)), np.ones((4, 2)), ShapeError, r"mse: prediction shape \(N, 1\) differs from target shape"),
    (np.ones((4, 2)), np.ones((3, 1)), ShapeError, r"mse: prediction shape \(4, 1\) differs from target"),
    (np.full((4, 2), np.nan), np.ones((4, 1)), ValueError, "input x contains 8 NaN"),
    (np.array([["a", "b"]]), np.ones((1, 1)), TypeError, "argument x must be numeric"),
])
def test_bad_input_never_touches_parameters(x, y, error, match):
    model = MLP(2, [4, 1], dtype=np.float64)
    step = jit(make_step(model, SGD(model.parameters(), lr=0.1)))
    step(np.ones((4, 2)), np.ones((4, 1)))
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(error, match=match):
        step(x, y)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


def test_traced_values_cannot_leak():
    leaked = []

    @jit
    def f(x):
        leaked.append(x)
        return x.sum()

    f(np.ones((2, 2)))
    with pytest.raises(RuntimeError, match="being traced"):
        _ = leaked[0].data


def test_unshared_leading_dims_trace_static_shapes():
    @jit
    def f(x, w):
        return (x @ w).sum()

    assert f(np.ones((2, 3)), np.ones((3, 4))) == 24.0
    assert f(np.ones((5, 3)), np.ones((3, 4))) == 60.0
    assert len(f._cache) == 2


def small_step(dtype=np.float32):
    model = MLP(2, [3, 1], dtype=dtype)
    return model, jit(make_step(model, SGD(model.parameters(), lr=0.1)), backend="numpy")


@pytest.mark.parametrize("x", [np.float32(1.0), 1.0, np.array(1.0, np.float32)])
def test_a_scalar_argument_is_a_shape_error_naming_the_layer(x):
    model, step = small_step()
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ShapeError, match=r"Layer: input has shape \(\), expected \(batch, 2\)"):
        step(x, np.ones((1, 1), np.float32))
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_python_lists_take_the_parameters_dtype(dtype):
    _, step = small_step(dtype)
    loss, pred = step([[1.0, 2.0], [0.5, -1.0]], [[0.5], [1.0]])
    assert pred.dtype == dtype and pred.shape == (2, 1)


def test_keyword_arguments_bind_like_a_call():
    model, step = small_step()
    x, y = np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)
    twin, twin_step = small_step()
    for a, b in zip(model.parameters(), twin.parameters()):
        b.data[...] = a.data
    np.testing.assert_array_equal(step(y=y, x=x)[0], twin_step(x, y)[0])
    with pytest.raises(TypeError, match="jit: step: .*'y'"):
        step(x, z=y)


def test_an_empty_backend_name_is_refused():
    with pytest.raises(ValueError, match="unknown backend ''"):
        jit(lambda x: x, backend="")



RETURNS = {  # what a step returns -> (its loss and prediction -> that, the length of the tuple or None)
    "loss": (lambda loss, pred: loss, None), "(loss,)": (lambda loss, pred: (loss,), 1),
    "(loss, pred)": (lambda loss, pred: (loss, pred), 2), "nothing": (lambda loss, pred: None, 0),
}


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("returned", list(RETURNS))
def test_a_call_returns_what_the_step_returned_on_every_call_path(backend, returned):
    pick, length = RETURNS[returned]
    model = MLP(3, [4, 2])
    full_step = make_step(model, SGD(model.parameters(), lr=0.1))

    def step(x, y):
        return pick(*full_step(x, y))

    compiled = jit(step, backend=backend)
    x, y = np.ones((7, 3), np.float32), np.ones((7, 2), np.float32)
    for _ in range(3):  # traced, then the call fast paths
        result = compiled(x, y)
        if length is None:
            assert isinstance(result, np.ndarray) and result.shape == ()
        elif length == 0:
            assert result is None
        else:
            assert isinstance(result, tuple) and len(result) == length
            assert result[0].shape == () and all(r.shape == (7, 2) for r in result[1:])
