"""``einsum`` (PyTorch's ``torch.einsum``) for one or two operands, mapped onto existing ops:
sums over letters only one operand has, a permute into (batch, free, contracted) order, one
batched product with broadcast batch axes, and a permute into the output's order."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, matmul


class EinsumError(ValueError):
    """An equation einsum does not accept or does not support."""


def einsum(equation: str, *operands: Any) -> Tensor:
    """``torch.einsum(equation, *operands)`` for one or two operands without ``...``."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    tensors = [t if isinstance(t, Tensor) else Tensor(t) for t in operands]
    terms, out = _parse(equation, tensors)
    if len(tensors) == 1:
        return _unary(equation, tensors[0], terms[0], out)
    if len(tensors) == 2:
        return _binary(equation, tensors, terms, out)
    raise EinsumError(f"einsum: equation {equation!r}: {len(tensors)} operands; one or two are supported")


def _parse(equation: str, tensors: list[Tensor]) -> tuple[list[str], str]:
    """The operands' letter terms and the output's (implicit: letters seen once, sorted)."""
    eq = equation.replace(" ", "")
    if "." in eq:
        raise EinsumError(f"einsum: equation {equation!r}: '...' is not supported")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if not all(c.isalpha() for c in "".join(terms) + out):
        raise EinsumError(f"einsum: equation {equation!r}: subscripts must be letters")
    if len(terms) != len(tensors):
        raise EinsumError(f"einsum: equation {equation!r} names {len(terms)} operands, {len(tensors)} given")
    for term, t in zip(terms, tensors):
        if len(term) != t.ndim:
            raise EinsumError(
                f"einsum: equation {equation!r}: term {term!r} has {len(term)} subscripts "
                f"for an operand of shape {tuple(t.shape)}"
            )
    letters = "".join(terms)
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(out)) != len(out) or not set(out) <= set(letters):
        raise EinsumError(f"einsum: equation {equation!r}: output subscripts must be distinct input subscripts")
    return terms, out


def _permute(x: Tensor, term: str, order: str) -> Tensor:
    perm = tuple(term.index(c) for c in order)
    return x if perm == tuple(range(x.ndim)) else x.permute(*perm)


def _reshape(x: Tensor, shape: tuple) -> Tensor:
    return x if tuple(x.shape) == tuple(shape) else x.reshape(*shape)


def _sum_out(x: Tensor, term: str, keep: set[str]) -> tuple[Tensor, str]:
    """``x`` summed over the letters of ``term`` not in ``keep``, with its remaining term."""
    axes = tuple(i for i, c in enumerate(term) if c not in keep)
    if not axes:
        return x, term
    return x.sum(axis=axes), "".join(c for c in term if c in keep)


def _unary(equation: str, x: Tensor, term: str, out: str) -> Tensor:
    if len(set(term)) != len(term):
        if len(term) == 2 and out in ("", term[0]):  # 'ii->i', 'ii->': the diagonal as a masked row sum
            diag = (x * Tensor(np.eye(x.shape[0], dtype=x.dtype))).sum(axis=1)
            return diag if out else diag.sum()
        raise EinsumError(
            f"einsum: equation {equation!r}: a repeated subscript within an operand is "
            "supported only as 'ii->i' or 'ii->'"
        )
    x, term = _sum_out(x, term, set(out))
    return _permute(x, term, out)


def _binary(equation: str, tensors: list[Tensor], terms: list[str], out: str) -> Tensor:
    for term in terms:
        if len(set(term)) != len(term):
            raise EinsumError(
                f"einsum: equation {equation!r}: a repeated subscript within an operand is "
                "not supported with two operands"
            )
    (a, b), (ta, tb) = tensors, terms
    a, ta = _sum_out(a, ta, set(tb) | set(out))
    b, tb = _sum_out(b, tb, set(ta) | set(out))
    batch = "".join(c for c in out if c in ta and c in tb)
    left = "".join(c for c in out if c in ta and c not in tb)
    right = "".join(c for c in out if c in tb and c not in ta)
    inner = "".join(c for c in ta if c in tb and c not in out)
    for c in inner:
        if a.shape[ta.index(c)] != b.shape[tb.index(c)]:
            raise EinsumError(
                f"einsum: equation {equation!r}: subscript {c!r} has sizes "
                f"{a.shape[ta.index(c)]} and {b.shape[tb.index(c)]}"
            )
    size_a = dict(zip(ta, a.shape))
    size_b = dict(zip(tb, b.shape))
    a = _permute(a, ta, batch + left + inner)
    b = _permute(b, tb, batch + inner + right)
    lead_a, lead_b = tuple(size_a[c] for c in batch), tuple(size_b[c] for c in batch)
    inner_size = math.prod(size_a[c] for c in inner)
    a = _reshape(a, lead_a + (math.prod(size_a[c] for c in left), inner_size))
    b = _reshape(b, lead_b + (inner_size, math.prod(size_b[c] for c in right)))
    product = matmul(a, b)
    sizes = {**size_a, **size_b}
    product = _reshape(product, tuple(product.shape[: len(batch)]) + tuple(sizes[c] for c in left + right))
    return _permute(product, batch + left + right, out)
