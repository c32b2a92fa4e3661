"""Affine maps for linalg ops: identity, broadcast, permutation, reduction and matmul maps."""

from __future__ import annotations

from mlir import ir

from mlir_nn.ir.shapes import Shape


def dims_map(n_dims: int, dims: list[int | None]) -> ir.AffineMap:
    """Map with result ``d<i>`` for each int and the constant 0 for each None."""
    exprs = [ir.AffineConstantExpr.get(0) if d is None else ir.AffineDimExpr.get(d) for d in dims]
    return ir.AffineMap.get(n_dims, 0, exprs)


def identity_map(rank: int) -> ir.AffineMap:
    return dims_map(rank, list(range(rank)))


def broadcast_map(operand: Shape, result: Shape) -> ir.AffineMap:
    """Numpy broadcasting: trailing dims align, size-1 dims against larger ones read index 0."""
    lead = len(result) - len(operand)
    dims: list[int | None] = []
    for i, d in enumerate(operand):
        dims.append(None if d == 1 and result[lead + i] != 1 else lead + i)
    return dims_map(len(result), dims)


def permutation_map(perm: tuple[int, ...]) -> ir.AffineMap:
    """Input map of a transpose whose output dim j is input dim perm[j]."""
    inverse = [0] * len(perm)
    for j, p in enumerate(perm):
        inverse[p] = j
    return dims_map(len(perm), inverse)


def reduction_map(rank: int, axes: tuple[int, ...], keepdims: bool) -> ir.AffineMap:
    """Output map of a reduction over ``axes`` of a rank-``rank`` input."""
    dims: list[int | None] = []
    for i in range(rank):
        if i not in axes:
            dims.append(i)
        elif keepdims:
            dims.append(None)
    return dims_map(rank, dims)


def matmul_maps(transpose_a: bool, transpose_b: bool) -> list[ir.AffineMap]:
    """linalg.matmul maps over (m, n, k) for op(a) @ op(b)."""
    m, n, k = 0, 1, 2
    a = [k, m] if transpose_a else [m, k]
    b = [n, k] if transpose_b else [k, n]
    return [dims_map(3, a), dims_map(3, b), dims_map(3, [m, n])]
