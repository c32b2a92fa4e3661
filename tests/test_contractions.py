"""einsum against PyTorch in float64 (values and gradients), against finite differences,
and compiled (numpy and cpu) against eager."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn.contractions import EinsumError
from mlir_nn.engine import Tensor
from tests.gradcheck import check_grads
from tests.holder import Holder

RNG = np.random.default_rng(2323)

# equation -> operand shapes
CASES = {
    "bhqd,bhkd->bhqk": [(2, 3, 4, 5), (2, 3, 6, 5)],
    "bhqk,bhkd->bhqd": [(2, 3, 4, 6), (2, 3, 6, 5)],
    "bij,bjk->bik": [(3, 4, 5), (3, 5, 2)],
    "ij,jk->ik": [(4, 5), (5, 3)],
    "bi,bi->b": [(4, 5), (4, 5)],
    "ij->ji": [(4, 5)],
    "ii->i": [(4, 4)],
    "ii": [(4, 4)],
    "ij->i": [(4, 5)],
    "ij,jk": [(4, 5), (5, 3)],
    "i,j->ij": [(4,), (3,)],
    "bij,jk->bki": [(2, 4, 5), (5, 3)],
    "bqd,kd->bkq": [(2, 4, 5), (3, 5)],
    "abc,cad->bd": [(2, 3, 4), (4, 2, 5)],
    "ij,kj->": [(3, 4), (2, 4)],
    "bhqd,bhkd->bhkq": [(1, 3, 4, 5), (2, 1, 6, 5)],
}
ARRAYS = {eq: [RNG.standard_normal(s) for s in shapes] for eq, shapes in CASES.items()}


@pytest.mark.parametrize("equation", sorted(CASES))
def test_equals_pytorch_in_float64(equation):
    xs = [Tensor(a) for a in ARRAYS[equation]]
    ts = [torch.tensor(a, requires_grad=True) for a in ARRAYS[equation]]
    ours, theirs = mlir_nn.einsum(equation, *xs), torch.einsum(equation, *ts)
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)
    w = RNG.standard_normal(tuple(theirs.shape))
    (ours * Tensor(w)).sum().backward()
    (theirs * torch.tensor(w)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad, t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("equation", ["bhqd,bhkd->bhqk", "abc,cad->bd", "ii->i", "bhqd,bhkd->bhkq"])
def test_gradients_match_finite_differences(equation):
    check_grads(lambda *xs: mlir_nn.einsum(equation, *xs), ARRAYS[equation])


def test_operands_as_a_list():
    a, b = ARRAYS["ij,jk->ik"]
    np.testing.assert_allclose(mlir_nn.einsum("ij,jk->ik", [Tensor(a), Tensor(b)]).data, a @ b, rtol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_compiled_equals_eager(backend):
    """Every case in one compiled step: outputs, and gradients of a weighted sum of them; the
    step input's rows (a batch axis) meet a parameter in two more equations."""
    names = sorted(CASES)
    params = {eq: [Tensor(a) for a in ARRAYS[eq]] for eq in names}
    weights = {eq: RNG.standard_normal(mlir_nn.einsum(eq, *params[eq]).shape) for eq in names}
    w_in = Tensor(RNG.standard_normal((5, 3)))
    model = Holder([p for eq in names for p in params[eq]] + [w_in])

    def step(rows):
        leaves = model.parameters()
        outs = [mlir_nn.einsum(eq, *params[eq]) for eq in names]
        total = sum((o * Tensor(weights[eq])).sum() for o, eq in zip(outs, names))
        outs += [mlir_nn.einsum("ni,ij->nj", rows, w_in), mlir_nn.einsum("ni,nj->ij", rows, rows @ w_in)]
        (total + (outs[-2] * outs[-2]).sum() + outs[-1].sum()).backward()
        result = outs + [p._grad for p in leaves]
        for p in leaves:
            p.grad = None
        return result

    rows = RNG.standard_normal((4, 5))
    expected = [t.data for t in step(Tensor(rows))]
    got = mlir_nn.jit(step, backend=backend, tiered=False)(rows)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("equation", "shapes", "message"),
    [
        ("...ij,jk->...ik", [(2, 3), (3, 4)], "'...' is not supported"),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "3 operands; one or two are supported"),
        ("iij,jk->ik", [(2, 2, 3), (3, 4)], "repeated subscript"),
        ("iji->j", [(2, 3, 2)], "repeated subscript"),
        ("ij,jk->ik", [(2, 3), (4, 5)], "subscript 'j' has sizes 3 and 4"),
        ("ij,jk->iq", [(2, 3), (3, 4)], "output subscripts must be distinct input subscripts"),
        ("ijk,jk->i", [(2, 3), (3, 4)], "term 'ijk' has 3 subscripts"),
        ("i1,1k->ik", [(2, 3), (3, 4)], "subscripts must be letters"),
    ],
)
def test_unsupported_equations_raise_naming_einsum(equation, shapes, message):
    with pytest.raises(
        EinsumError, match=r"einsum: equation '.*': .*" + message.replace("(", r"\(").replace(".", r"\.")
    ):
        mlir_nn.einsum(equation, *[Tensor(np.zeros(s)) for s in shapes])
