"""Indexing, shape ops and batched products against PyTorch in float64 (values and gradients),
against finite differences, and compiled (numpy and cpu) against eager."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from tests.gradcheck import check_grads
from tests.holder import Holder

RNG = np.random.default_rng(23)
X = RNG.standard_normal((2, 3, 4))
Y = RNG.standard_normal((2, 4, 5))
GATHER_INDEX = RNG.integers(0, 4, (2, 3, 5))
MASK = RNG.random((3, 4)) < 0.5


def _idx(m, values):
    """An integer index in each library's own form."""
    return torch.tensor(values) if m is torch else np.asarray(values)


def _mask(m, values):
    return torch.tensor(values) if m is torch else values


# name -> f(m, x, y) where m is torch or mlir_nn and x, y are (2, 3, 4) and (2, 4, 5) tensors
CASES = {
    "int": lambda m, x, y: x[1],
    "int_slice_int": lambda m, x, y: x[-1, :, 2],
    "steps": lambda m, x, y: x[:, ::2, 1:4:2],
    "none_ellipsis": lambda m, x, y: x[..., None, 1:3],
    "step_3": lambda m, x, y: x[:, :, 1::3],
    "array_repeats": lambda m, x, y: x[:, _idx(m, [2, 0, 2])],
    "array_2d": lambda m, x, y: x[_idx(m, [[1, 0], [1, 1]])],
    "array_negative": lambda m, x, y: x[:, :, _idx(m, [-1, 0])],
    "index_select": lambda m, x, y: m.index_select(x, 2, _idx(m, [3, 3, 0])),
    "gather": lambda m, x, y: m.gather(x, 2, _idx(m, GATHER_INDEX)),
    "masked_fill": lambda m, x, y: x.masked_fill(_mask(m, MASK), -1.5),
    "where": lambda m, x, y: m.where(x > 0.2, x, 2 * x),
    "where_scalar": lambda m, x, y: m.where(x < 0, 0.0, x),
    "compare": lambda m, x, y: (x >= 0.1) * x + (x <= -0.3) * x * 3 + x.ne(x[:, :1]) * x + x.eq(x) * x,
    "tril": lambda m, x, y: m.tril(x),
    "triu": lambda m, x, y: m.triu(x, 1),
    "cat": lambda m, x, y: m.cat([x, x[:, :1] * 2, x[:, 1:]], 1),
    "stack": lambda m, x, y: m.stack([x, x * x], 2),
    "split": lambda m, x, y: [p.sum(2) * (i + 1) for i, p in enumerate(m.split(x, 3, dim=2))][1],
    "split_sections": lambda m, x, y: m.split(x, [1, 2], dim=1)[1] * m.split(x, [1, 2], dim=1)[0],
    "chunk": lambda m, x, y: x.chunk(2, 1)[1],
    "unsqueeze_squeeze": lambda m, x, y: x.unsqueeze(1).unsqueeze(-1)[:, :, :1].squeeze(),
    "view": lambda m, x, y: x.view(-1, 4) * 1.5,
    "reshape": lambda m, x, y: x.reshape(2, -1)[:, 5:],
    "permute": lambda m, x, y: x.permute(2, 0, 1),
    "transpose": lambda m, x, y: x.transpose(0, 2),
    "expand": lambda m, x, y: x[:, :1].expand(-1, 3, 4) * x,
    "bmm": lambda m, x, y: m.bmm(x, y),
    "matmul_4d_broadcast": lambda m, x, y: x.reshape(2, 1, 3, 4) @ y.reshape(1, 2, 4, 5),
    "matmul_3d_2d": lambda m, x, y: x @ y[0],
    "matmul_2d_3d": lambda m, x, y: x[0] @ y,
    "matmul_1d_3d": lambda m, x, y: x[0, 0] @ y,
    "matmul_3d_1d": lambda m, x, y: x @ y[0, :, 0],
    "arange_index": lambda m, x, y: x[:, m.arange(2)],
}


def _grads(out_ours, out_torch, xs_ours, xs_torch):
    w = RNG.standard_normal(tuple(out_torch.shape))
    (out_ours * Tensor(w)).sum().backward()
    (out_torch * torch.tensor(w)).sum().backward()
    return [(a.grad, b.grad.numpy() if b.grad is not None else np.zeros(b.shape)) for a, b in zip(xs_ours, xs_torch)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_pytorch_in_float64(name):
    f = CASES[name]
    xs = [Tensor(X), Tensor(Y)]
    ts = [torch.tensor(X, requires_grad=True), torch.tensor(Y, requires_grad=True)]
    ours, theirs = f(mlir_nn, *xs), f(torch, *ts)
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)
    for g_ours, g_torch in _grads(ours, theirs, xs, ts):
        np.testing.assert_allclose(g_ours, g_torch, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["steps", "step_3", "array_repeats", "gather", "where", "cat", "split",
                                  "matmul_4d_broadcast", "masked_fill", "tril"])
def test_gradients_match_finite_differences(name):
    check_grads(lambda x, y: CASES[name](mlir_nn, x, y), [X, Y])


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_compiled_equals_eager(backend):
    """Every case in one compiled step: outputs, and the gradients of a weighted sum of them;
    the row index of x[index] is a step input, checked before each call."""
    weights = {name: RNG.standard_normal(CASES[name](mlir_nn, Tensor(X), Tensor(Y)).shape) for name in CASES}
    x, y = Tensor(X), Tensor(Y)
    model = Holder([x, y])  # gives the step's dtype, which integer inputs are fed in

    def step(rows):
        model.parameters()
        outs = [CASES[name](mlir_nn, x, y) for name in sorted(CASES)] + [x[rows]]
        total = sum((o * Tensor(weights[n])).sum() for o, n in zip(outs, sorted(CASES)))
        (total + outs[-1].sum()).backward()
        result = outs + [x._grad, y._grad]
        x.grad, y.grad = None, None
        return result

    rows = np.array([[1.0, 0.0, 1.0]])
    expected = [t.data for t in step(Tensor(rows.astype(float)))]
    got = mlir_nn.jit(step, backend=backend, tiered=False)(rows)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"take \(step argument rows\): indices must be integers in \[-2, 2\)"):
        mlir_nn.jit(step, backend=backend, tiered=False)(np.array([[1.0, 2.0, 0.0]]))


def test_bad_indices_raise_naming_the_op():
    x = Tensor(X)
    with pytest.raises(IndexError, match="__getitem__: index 3 is out of range for axis 1"):
        x[:, 3]
    with pytest.raises(ValueError, match=r"take: indices must be integers in \[-3, 3\)"):
        x[:, [0, 3]]
    with pytest.raises(ValueError, match="take: indices must be integers"):
        x[:, np.array([0.5])]
    with pytest.raises(ValueError, match="gather: indices must be integers"):
        mlir_nn.gather(x, 0, np.full((2, 3, 4), 2))
    with pytest.raises(IndexError, match="one integer-array index"):
        x[[0], [1]]
    with pytest.raises(TypeError, match="boolean masks cannot index"):
        x[np.array([True, False])]
    with pytest.raises(ValueError, match="slice step must be positive"):
        x[:, ::-1]
    with pytest.raises(IndexError, match="is empty"):
        x[:, 2:1]
    with pytest.raises(IndexError, match="does not index"):
        x[0, 0, 0, 0]
    with pytest.raises(ShapeError, match="cat: shapes"):
        mlir_nn.cat([x, Tensor(Y)], 0)
    with pytest.raises(ShapeError, match="split: sections"):
        mlir_nn.split(x, [1, 1], 1)
    with pytest.raises(ShapeError, match="matmul: inner dimensions differ"):
        x @ x
    with pytest.raises(ShapeError, match="bmm: expected 3-D"):
        mlir_nn.bmm(x[0], Y[0])
    with pytest.raises(ShapeError, match="gather: index"):
        mlir_nn.gather(x, 2, np.zeros((2, 2, 4), int))
