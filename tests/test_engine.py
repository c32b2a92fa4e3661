"""Eager tensors: tinynn's Value API, broadcasting, errors."""

import numpy as np
import pytest

from mlir_nn.engine import Tensor, Value
from mlir_nn.ir import DTypeError, ShapeError


def test_seed_scalar_example_matches_tinynn():
    a = Value(2.0, label="a")
    b = Value(-3.0, label="b")
    c = Value(10.0, label="c")
    d = a * b
    d.label = "d"
    e = d + c
    e.label = "e"
    f = e.relu()
    f.label = "f"
    f.backward()
    assert (a.grad, b.grad, c.grad, d.grad, e.grad, f.grad) == (-3.0, 2.0, 1.0, 1.0, 1.0, 1.0)
    assert f.data == 4.0 and isinstance(a.grad, np.ndarray) and a.grad.shape == ()


def test_reversed_operators_and_unary_ops():
    x = Value(3.0)
    y = (2 - x) * 4 / (1 + x) + 2 ** 0 - (-x) ** 2 + 10 / x
    assert y.data == pytest.approx((2 - 3) * 4 / 4 + 1 - 9 + 10 / 3)
    y.backward()
    assert x.grad == pytest.approx(-4 / 4 - (-4) / 16 - 6 - 10 / 9, rel=1e-6)
    for name, fn in [("tanh", np.tanh), ("exp", np.exp), ("sigmoid", lambda v: 1 / (1 + np.exp(-v)))]:
        assert getattr(Value(0.3), name)().data == pytest.approx(fn(0.3), rel=1e-6)


def test_backward_fills_intermediates_and_accumulates():
    x = Tensor([[1.0, -2.0], [3.0, 4.0]])
    h = x * 2
    h.sum().backward()
    np.testing.assert_array_equal(h.grad, np.ones((2, 2)))
    np.testing.assert_array_equal(x.grad, 2 * np.ones((2, 2)))
    h.sum().backward()
    np.testing.assert_array_equal(x.grad, 4 * np.ones((2, 2)))
    x.grad = 0
    np.testing.assert_array_equal(x.grad, np.zeros((2, 2)))


def test_broadcasting_gradients_follow_numpy():
    x = Tensor(np.ones((4, 3)))
    b = Tensor(np.arange(3.0))
    ((x + b) * b).sum().backward()
    np.testing.assert_array_equal(b.grad, 4 * (1 + 2 * np.arange(3.0)))
    np.testing.assert_array_equal(x.grad, np.broadcast_to(np.arange(3.0), (4, 3)))


def test_matmul_and_transpose():
    a = Tensor(np.random.randn(3, 4))
    b = Tensor(np.random.randn(4, 2))
    np.testing.assert_allclose((a @ b).data, a.data @ b.data, rtol=1e-6)
    np.testing.assert_allclose((a.T @ a).data, a.data.T @ a.data, rtol=1e-6)
    v = Tensor(np.random.randn(4))
    np.testing.assert_allclose((a @ v).data, a.data @ v.data, rtol=1e-6)
    np.testing.assert_allclose((v @ b).data, v.data @ b.data, rtol=1e-6)


def test_dtypes_follow_numpy():
    """Python numbers make float64 values (issue 10, defect 1); float arrays keep their dtype."""
    assert Value(1.0).dtype == "float64" and Tensor([1, 2]).dtype == "float64"
    assert Tensor(np.zeros(2, np.float32)).dtype == "float32"
    assert (Tensor(np.zeros(2, np.float32)) * 2.5).dtype == "float32"  # numbers take the tensor's dtype


def test_mixed_dtypes_promote_to_float64_and_grads_keep_each_dtype():
    x32 = Tensor(np.array([1.0, 2.0], np.float32))
    x64 = Tensor(np.array([3.0, 4.0]))
    y = x32 * x64
    assert y.dtype == "float64"
    y.sum().backward()
    assert x32.grad.dtype == np.float32 and x64.grad.dtype == np.float64
    np.testing.assert_array_equal(x32.grad, [3.0, 4.0])
    np.testing.assert_array_equal(x64.grad, [1.0, 2.0])
    assert (x32 @ Tensor(np.ones((2, 1)))).dtype == "float64"


def test_mixed_dtypes_inside_a_traced_step_raise():
    import mlir_nn

    w64 = Tensor(np.ones((2, 1)))

    @mlir_nn.jit(backend="numpy")
    def step(x):
        return (x * w64.T).sum()

    with pytest.raises(DTypeError, match="mul: operands have different dtypes"):
        step(np.ones((3, 2), np.float32))


@pytest.mark.parametrize("build,error,match", [
    (lambda: Tensor(np.ones((2, 3))) @ Tensor(np.ones((2, 3))), ShapeError,
     r"matmul: inner dimensions differ: \(2, 3\) @ \(2, 3\)"),
    (lambda: Tensor(np.ones((2, 3))) + Tensor(np.ones(4)), ShapeError,
     r"add: shapes \(2, 3\) and \(4,\) do not broadcast"),
    (lambda: Tensor("abc"), TypeError, "must be numeric"),
    (lambda: Tensor([1.0, None]), TypeError, "must be numeric"),
    (lambda: Value(2.0) ** Value(2.0), TypeError, "exponent must be a Python number"),
    (lambda: Tensor(np.ones(3)).sum(axis=2), ShapeError, "axis 2 is out of range"),
    (lambda: Tensor(np.ones(6)).reshape(4, -1), ShapeError, "cannot reshape"),
])
def test_bad_input_raises_clear_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_backward_on_a_non_scalar_needs_a_gradient():
    """Issue 10, defect 5: as PyTorch, no silent seed of ones for a non-scalar tensor."""
    x = Tensor(np.array([1.0, 2.0, 3.0]))
    y = x * x
    with pytest.raises(RuntimeError, match=r"backward: tensor of shape \(3,\) is not a scalar; pass gradient="):
        y.backward()
    y.backward(gradient=np.array([1.0, 0.0, -1.0]))
    np.testing.assert_array_equal(x.grad, [2.0, 0.0, -6.0])
    with pytest.raises(ShapeError, match=r"backward: gradient \(2,\):float64 does not match the tensor \(3,\)"):
        y.backward(gradient=np.ones(2))
    z = Tensor(np.array([[2.0]]))
    (z * 3).backward()  # one element: implicit, as PyTorch
    assert z.grad[0, 0] == 3.0


def test_astype_inside_a_traced_step_raises():
    import mlir_nn

    @mlir_nn.jit(backend="numpy")
    def step(x):
        return x.astype(np.float64).sum()

    with pytest.raises(DTypeError, match=r"astype: a traced step computes in one dtype; .* is float32, asked for"):
        step(np.ones((3, 2), np.float32))
