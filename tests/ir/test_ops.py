"""Every op's VJP against float64 central finite differences, on random shapes."""

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlir_nn.engine import Tensor, apply, stack
from mlir_nn.ir import OPS
from tests.gradcheck import check_grads

dims = st.integers(1, 4)
shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast: the second drops leading dims and sets some to 1."""
    a = draw(st.lists(dims, min_size=1, max_size=3).map(tuple))
    drop = draw(st.integers(0, len(a)))
    b = tuple(1 if draw(st.booleans()) else d for d in a[drop:])
    return (a, b) if draw(st.booleans()) else (b, a)


def arr(shape, low=-2.0, high=2.0, seed=0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@given(shapes=broadcast_pair())
def test_binary_broadcasting_grads(op, shapes):
    a = arr(shapes[0], seed=1)
    b = arr(shapes[1], 0.5, 2.0, seed=2) if op == "div" else arr(shapes[1], seed=2)
    check_grads(lambda x, y: apply(op, x, y), [a, b])


@pytest.mark.parametrize("op,low,high", [
    ("neg", -2, 2), ("tanh", -2, 2), ("sigmoid", -4, 4), ("exp", -2, 2),
    ("log", 0.5, 3), ("sqrt", 0.5, 3),
])
@given(shape=shapes)
def test_unary_grads(op, low, high, shape):
    check_grads(lambda x: apply(op, x), [arr(shape, low, high)])


def test_log_of_zero_is_minus_infinity_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = Tensor(np.array([0.0, 1.0])).log().data
    assert out[0] == -np.inf and out[1] == 0.0


@given(shape=shapes)
def test_relu_grad_away_from_kink(shape):
    x = arr(shape)
    x[np.abs(x) < 0.05] = 0.5
    check_grads(lambda t: t.relu(), [x])


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, -1.0])
@given(shape=shapes)
def test_pow_grads(exponent, shape):
    check_grads(lambda x: x ** exponent, [arr(shape, 0.5, 2.0)])


@given(m=dims, k=dims, n=dims, ta=st.booleans(), tb=st.booleans())
def test_matmul_grads(m, k, n, ta, tb):
    a = arr((k, m) if ta else (m, k), seed=3)
    b = arr((n, k) if tb else (k, n), seed=4)
    check_grads(lambda x, y: apply("matmul", x, y, transpose_a=ta, transpose_b=tb), [a, b])


@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), data=st.data())
def test_layout_grads(shape, data):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    check_grads(lambda x: x.transpose(perm), [arr(shape)])
    check_grads(lambda x: x.reshape(-1), [arr(shape)])
    target = (data.draw(dims),) + tuple(d if data.draw(st.booleans()) else d for d in shape)
    check_grads(lambda x: x.broadcast_to(target), [arr(shape)])


@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), data=st.data(), keepdims=st.booleans())
def test_reduction_grads(shape, data, keepdims):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    check_grads(lambda x: x.sum(axis=axes, keepdims=keepdims), [arr(shape)])
    check_grads(lambda x: x.mean(axis=axes, keepdims=keepdims), [arr(shape)])
    check_grads(lambda x: x.mean(), [arr(shape)])


@given(pair=broadcast_pair())
def test_sum_to_grads(pair):
    big, small = sorted(pair, key=len, reverse=True)
    full = np.broadcast_shapes(big, small)
    check_grads(lambda x: apply("sum_to", x, shape=small), [arr(full)])


@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple))
def test_mse_grads(shape):
    check_grads(lambda p, y: apply("mse", p, y), [arr(shape, seed=5), arr(shape, seed=6)])


@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), data=st.data(), keepdims=st.booleans())
def test_max_grads(shape, data, keepdims):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    x = np.random.default_rng(7).permutation(np.prod(shape)).reshape(shape) * 0.5  # distinct: no ties
    check_grads(lambda t: t.max(axis=axes, keepdims=keepdims), [x])


def test_max_shares_the_gradient_between_ties_as_pytorch_amax():
    x = Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]]))
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [0.5, 0, 0.5]])
    assert np.array_equal(x.argmax(axis=1), [1, 0])


@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), data=st.data())
def test_log_softmax_and_softmax_grads(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    check_grads(lambda x: x.log_softmax(axis), [arr(shape, -3, 3)])
    check_grads(lambda x: x.softmax(axis), [arr(shape, -3, 3)])


@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple))
def test_cast_and_stack_grads(shape):
    x = Tensor(arr(shape))
    weight = arr(shape, seed=3).astype(np.float32)
    (x.astype(np.float32) * Tensor(weight)).sum().backward()  # float32 has no room for finite differences
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad, weight)
    check_grads(lambda x, y: stack([x, y, x]), [arr(shape, seed=1), arr(shape, seed=2)])


def test_one_hot_and_eq_have_no_gradient_and_check_labels():
    labels = Tensor(np.array([2.0, 0.0]))
    np.testing.assert_array_equal(apply("one_hot", labels, classes=3).data, [[0, 0, 1], [1, 0, 0]])
    x = Tensor(np.array([1.0, 2.0]))
    (apply("eq", x, 2.0) * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 1.0])  # only through the product, not through eq
    with pytest.raises(ValueError, match=r"one_hot: labels must be integers in \[0, 3\), got \[3.0, 0.5\]"):
        apply("one_hot", Tensor(np.array([3.0, 0.5, 1.0])), classes=3)


@given(shape=shapes)
def test_erf_grads(shape):
    check_grads(lambda x: apply("erf", x), [arr(shape)])


@pytest.mark.parametrize("p", [0.0, 0.3, 0.9])
@given(shape=shapes)
def test_dropout_grads_use_the_forward_mask(p, shape):
    """Linear in x for fixed key and offset chunks: finite differences see the same mask."""
    chunks = [Tensor(np.array(float(c))) for c in (7, 1, 0, 3, 5, 0, 0)]
    check_grads(lambda x: apply("dropout", x, *chunks, p=p, slot=1), [arr(shape)])


def test_numel_counts_elements_and_passes_no_gradient():
    x = Tensor(arr((3, 4, 2)))
    n = apply("numel", x, axes=(0, 2))
    assert float(n.data) == 6.0
    (x * n).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full((3, 4, 2), 6.0))  # only through the product


def test_every_differentiable_op_is_covered():
    """A new op with a VJP must get a gradient test above."""
    covered = {"add", "sub", "mul", "div", "neg", "tanh", "sigmoid", "exp", "log", "sqrt", "relu", "pow",
               "matmul", "transpose", "reshape", "broadcast_to", "sum", "mean", "sum_to", "mse",
               "max", "eq", "log_softmax", "cast", "stack", "one_hot",
               "erf", "dropout", "numel"}
    # tests/ir/test_sequence_ops.py
    covered |= {"slice", "slice_grad", "take", "gather", "where", "lt", "le", "gt", "ge", "ne", "bmm"}
    covered |= {"conv2d", "conv2d_input_grad", "conv2d_weight_grad", "max_pool2d", "max_pool2d_index", "avg_pool2d",
                "avg_pool2d_grad", "adaptive_avg_pool2d", "adaptive_avg_pool2d_grad", "pad"}  # tests/ir/test_windows.py
    covered |= {"sign", "abs", "maximum", "minimum", "softplus"}  # tests/ir/test_loss_ops.py
    covered |= {"softmax", "layer_norm"}  # tests/ir/test_row_ops.py
    with_vjp = {name for name, d in OPS.items() if d.vjp is not None}
    assert with_vjp <= covered, f"ops without a gradient test: {sorted(with_vjp - covered)}"
