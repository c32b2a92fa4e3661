"""softmax and layer_norm as ops of their own (shape rules, NumPy references, VJPs): equal to
PyTorch in float64, forward and backward, at awkward sizes; gradients by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError
from mlir_nn.nn import functional as F
from tests.gradcheck import check_grads

SHAPES = [(1, 1), (1, 7), (13, 5), (33, 64), (257, 3), (2, 3, 13), (2, 2, 7, 33)]


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) * 3.0 + 1.0, rng.standard_normal(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_equals_pytorch_with_its_gradient(shape):
    x, g = _data(shape)
    for axis in range(len(shape)):
        t = Tensor(x)
        out = t.softmax(axis)
        (out * Tensor(g)).sum().backward()
        tx = torch.tensor(x, requires_grad=True)
        want = torch.softmax(tx, axis)
        (want * torch.tensor(g)).sum().backward()
        np.testing.assert_allclose(out.data, want.detach().numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(t.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_softmax_of_masked_rows_is_zero_where_masked_and_keeps_its_gradient_there_zero():
    x, g = _data((7, 13), seed=1)
    mask = np.triu(np.ones((7, 13), bool), 1)  # a causal mask: row i sees columns 0..i
    t = Tensor(x)
    out = t.masked_fill(mask, float("-inf")).softmax(-1)
    (out * Tensor(g)).sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    want = torch.softmax(tx.masked_fill(torch.from_numpy(mask), float("-inf")), -1)
    (want * torch.tensor(g)).sum().backward()
    assert np.all(out.data[mask] == 0.0) and np.all(t.grad[mask] == 0.0)
    np.testing.assert_allclose(out.data, want.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("shape", [(1, 1), (7, 7), (2, 7, 13), (2, 2, 13, 7), (3, 33, 33)])
def test_causal_softmax_equals_pytorch_masked_with_its_gradient(shape):
    x, g = _data(shape, seed=3)
    mask = np.triu(np.ones(shape[-2:], bool), 1)
    t = Tensor(x)
    out = apply("softmax", t, axis=len(shape) - 1, causal=True)
    (out * Tensor(g)).sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    want = torch.softmax(tx.masked_fill(torch.from_numpy(mask), float("-inf")), -1)
    (want * torch.tensor(g)).sum().backward()
    assert np.all(out.data[..., mask] == 0.0) and np.all(t.grad[..., mask] == 0.0)
    np.testing.assert_allclose(out.data, want.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-14)
    check_grads(lambda v: apply("softmax", v, axis=len(shape) - 1, causal=True), [x])


def test_causal_softmax_ignores_what_it_hides_and_its_gradient_is_causal():
    x = np.array([[0.5, np.inf, np.nan], [1.0, 2.0, np.inf], [0.0, 1.0, 2.0]])
    out = apply("softmax", Tensor(x), axis=1, causal=True)
    want = torch.softmax(torch.tensor(np.where(np.triu(np.ones((3, 3), bool), 1), -np.inf, x)), -1)
    np.testing.assert_allclose(out.data, want.numpy(), rtol=1e-12)
    above = np.triu(np.ones((3, 3), bool), 1)
    grad = apply("softmax_grad", out, Tensor(np.where(above, np.inf, 1.0)), axis=1, causal=True)
    assert np.all(grad.data[above] == 0.0) and np.all(np.isfinite(grad.data))


@pytest.mark.parametrize("axis, shape", [(0, (4, 4)), (0, (4,)), (1, (2, 4, 4))])
def test_causal_softmax_runs_along_the_last_of_two_axes_only(axis, shape):
    with pytest.raises(ShapeError, match="causal"):
        apply("softmax", Tensor(np.zeros(shape)), axis=axis, causal=True)


def test_softmax_of_large_logits_is_finite():
    x = np.array([[1e4, 0.0, -1e4], [-1e30, -1e30, 0.0]])
    np.testing.assert_allclose(Tensor(x).softmax(-1).data, [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_equals_pytorch_with_its_gradients(shape, affine):
    x, g = _data(shape)
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    t, tw, tb = Tensor(x), Tensor(w), Tensor(b)
    out = F.layer_norm(t, shape[-1], tw if affine else None, tb if affine else None, eps=1e-5)
    (out * Tensor(g)).sum().backward()
    tx, ttw, ttb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    want = torch.nn.functional.layer_norm(tx, (shape[-1],), ttw if affine else None, ttb if affine else None, 1e-5)
    (want * torch.tensor(g)).sum().backward()
    assert "layer_norm" in {out._op} | {i._op for i in out._inputs} | {j._op for i in out._inputs for j in i._inputs}
    np.testing.assert_allclose(out.data, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-11)
    if affine:
        np.testing.assert_allclose(tw.grad, ttw.grad.numpy(), rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(tb.grad, ttb.grad.numpy(), rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("shape", [(1, 2), (3, 5), (2, 3, 4)])
def test_row_op_gradients_by_finite_differences(shape):
    x, _ = _data(shape, seed=3)
    check_grads(lambda t: apply("layer_norm", t, eps=1e-5), [x])
    check_grads(lambda t: apply("layer_norm", t, eps=0.5), [x])
    check_grads(lambda t: t.softmax(-1), [x])
    check_grads(lambda t: t.softmax(0), [x])


def test_constant_rows_normalize_to_zero_with_a_finite_gradient():
    t = Tensor(np.full((3, 4), 2.5))
    out = apply("layer_norm", t, eps=1e-5)
    (out * Tensor(np.arange(12.0).reshape(3, 4))).sum().backward()
    np.testing.assert_array_equal(out.data, 0.0)
    assert np.isfinite(t.grad).all()


def test_bad_operands_name_the_op():
    with pytest.raises(ShapeError, match="layer_norm: expected a tensor of at least 1 dimension"):
        apply("layer_norm", Tensor(np.array(1.0)), eps=1e-5)
    with pytest.raises(ValueError, match="layer_norm: eps must be a non-negative number"):
        apply("layer_norm", Tensor(np.ones((2, 3))), eps=-1.0)
    with pytest.raises(ShapeError, match="layer_norm_grad"):
        apply("layer_norm_grad", Tensor(np.ones((2, 3))), Tensor(np.ones((2, 4))), eps=1e-5)
    with pytest.raises(ShapeError, match="softmax"):
        apply("softmax", Tensor(np.ones((2, 3))), axis=2)
    with pytest.raises(ShapeError, match="layer_norm: input has shape"):
        F.layer_norm(Tensor(np.ones((2, 3))), 4)
