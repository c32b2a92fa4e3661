"""The sequence-model ops of the registry: shape rules, references and VJPs (float64 finite
differences), and the index checks of the references."""

import numpy as np
import pytest

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError, TensorType, op_def
from tests.gradcheck import check_grads

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 5, 4))
INDEX = np.array([[4.0, 0.0], [4.0, -1.0]])  # repeated and negative


def test_slice_and_its_gradient():
    attrs = dict(start=(1, 0, 1), step=(1, 2, 2), shape=(2, 3, 2))
    np.testing.assert_array_equal(apply("slice", Tensor(X), **attrs).data, X[1:3, 0:5:2, 1:4:2])
    check_grads(lambda x: apply("slice", x, **attrs), [X])
    g = RNG.standard_normal((2, 3, 2))
    check_grads(lambda g: apply("slice_grad", g, start=(1, 0, 1), step=(1, 2, 2), shape=(3, 5, 4)), [g])
    placed = apply("slice_grad", Tensor(g), start=(1, 0, 1), step=(1, 2, 2), shape=(3, 5, 4)).data
    assert placed.sum() == pytest.approx(g.sum()) and placed[0].sum() == 0.0


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_and_its_scatter_add_gradient(axis):
    index = Tensor(np.where(INDEX < 0, INDEX, INDEX % X.shape[axis]))
    check_grads(lambda x: apply("take", x, index, axis=axis), [X])
    expected = np.take(X, index.data.astype(int), axis=axis)
    np.testing.assert_array_equal(apply("take", Tensor(X), index, axis=axis).data, expected)


def test_gather_and_its_scatter_add_gradient():
    index = Tensor(RNG.integers(0, 5, (3, 6, 4)).astype(float))
    check_grads(lambda x: apply("gather", x, index, axis=1), [X])


def test_where_and_comparisons():
    y = RNG.standard_normal((5, 1))
    cond = Tensor((RNG.random((3, 5, 4)) < 0.5).astype(float))
    check_grads(lambda x, y: apply("where", cond, x, y), [X, y])
    for op, fn in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                   ("ne", np.not_equal)):
        x = Tensor(X)
        out = apply(op, x, Tensor(y))
        np.testing.assert_array_equal(out.data, fn(X, y).astype(float))
        (out * x).sum().backward()
        np.testing.assert_array_equal(x.grad, fn(X, y))  # only through the product


def test_bmm_grads_and_shape_rule():
    b = RNG.standard_normal((3, 4, 2))
    check_grads(lambda x, b: apply("bmm", x, b), [X, b])
    with pytest.raises(ShapeError, match="bmm: expected"):
        op_def("bmm").infer([TensorType((3, 5, 4), "float64"), TensorType((2, 4, 2), "float64")], {})


def test_indices_are_checked_and_shapes_named():
    with pytest.raises(ValueError, match=r"take: indices must be integers in \[-5, 5\) for an axis of size 5, "
                                         r"got \[5.0\]"):
        apply("take", Tensor(X), Tensor(np.array([5.0])), axis=1)
    with pytest.raises(ValueError, match=r"take_grad: indices must be integers in \[-5, 5\) for an axis of size 5, "
                                         r"got \[0.5\]"):
        apply("take_grad", Tensor(np.ones((3, 1, 4))), Tensor(np.array([0.5])), axis=1, size=5)
    with pytest.raises(ShapeError, match="slice: 3 elements from 3 by step 1 do not fit an axis of size 5"):
        apply("slice", Tensor(X), start=(0, 3, 0), step=(1, 1, 1), shape=(3, 3, 4))
    with pytest.raises(ShapeError, match="slice: step must be positive"):
        apply("slice", Tensor(X), start=(0, 4, 0), step=(1, -1, 1), shape=(3, 2, 4))
    with pytest.raises(ShapeError, match="take: cannot index along the batch dimension"):
        op_def("take").infer([TensorType(("N", 4), "float32"), TensorType((2,), "float32")], {"axis": 0})
