"""Batched products (``bmm``) as a loop over the batch of 2-D ``linalg.matmul`` ops.

The batch axes are merged into one (a view), an ``scf.for`` runs over it, and each iteration
multiplies one pair of matrices (rank-reducing slices, views) with ``linalg.matmul`` into a
slice of the result. The CPU backend then gives each product the schedule of a 2-D one
(``cpu_matmul``: packed register blocks for large ones, vectorized loop orders for small
ones); as one ``linalg.generic`` LLVM left it as scalar loops. An operand that is a transpose
of its last two axes is read untransposed, the product's indexing maps transposing it
(attention's ``q @ k^T`` and the gradients ``g @ b^T``, ``a^T @ g``). Without strided views
(``FunctionBuilder.strided_copies`` off: the CUDA path, whose kernels see no subviews) a bmm is one
batched ``linalg.generic`` instead, which the GPU schedules map onto threads.
"""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith, scf, tensor

from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
from mlir_nn.ir import Node


def _swaps_last(node: Node) -> bool:
    """``node`` is a transpose of its last two axes only."""
    if node.op != "transpose" or node.inputs[0].op == "const":
        return False
    rank = len(node.shape)
    return tuple(node.attr("perm")) == tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _merged(b: FunctionBuilder, x: ir.Value, shape: tuple) -> ir.Value:
    """``x`` of ``shape`` (..., r, c) viewed as (batch, r, c)."""
    rank = len(shape)
    if rank == 3:
        return x
    dynamic = any(isinstance(s, ir.Value) for s in b.sizes(shape[:-2]))
    count = ir.ShapedType.get_dynamic_size() if dynamic else math.prod(int(d) for d in shape[:-2])
    kind = ir.RankedTensorType.get([count, int(shape[-2]), int(shape[-1])], b.element)
    return tensor.collapse_shape(kind, x, [list(range(rank - 2)), [rank - 2], [rank - 1]])


def _matrix(b: FunctionBuilder, x: ir.Value, i: ir.Value, rows: int, cols: int) -> ir.Value:
    """Matrix ``i`` of a (batch, rows, cols) tensor (a rank-reducing slice)."""
    dynamic = ir.ShapedType.get_dynamic_size()
    kind = ir.RankedTensorType.get([rows, cols], b.element)
    return tensor.extract_slice(kind, x, [i], [], [], [dynamic, 0, 0], [1, rows, cols], [1, 1, 1])


def _batched_generic(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """Loops (batch.., m, k, n): a[.., m, k] * b[.., k, n] summed over k, as one linalg.generic."""
    rank = len(node.shape)
    lhs, rhs = (b.tensor_of(v, i.shape) for v, i in zip(xs, node.inputs))
    batch, m, k, n = list(range(rank - 2)), rank - 2, rank - 1, rank
    maps = [ir.AffineMap.get(rank + 1, 0, [ir.AffineDimExpr.get(d) for d in batch + [m, k]]),
            ir.AffineMap.get(rank + 1, 0, [ir.AffineDimExpr.get(d) for d in batch + [k, n]])]
    out_map = ir.AffineMap.get(rank + 1, 0, [ir.AffineDimExpr.get(d) for d in batch + [m, n]])
    iterators = [PARALLEL] * (rank - 1) + [REDUCTION, PARALLEL]
    return b.reduce(node.shape, [lhs, rhs], maps, out_map, iterators, arith.mulf)


def lower_bmm(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """(..., m, k) @ (..., k, n): one ``linalg.matmul`` per batch element (one batched generic without
    strided views)."""
    if not b.strided_copies:
        return _batched_generic(b, node, xs)
    operands, shapes, flips = [], [], []
    for value, src in zip(xs, node.inputs):
        flipped = _swaps_last(src)
        if flipped:
            value, src = b.source_of_transpose[src], src.inputs[0]
        operands.append(_merged(b, b.tensor_of(value, src.shape), src.shape))
        shapes.append((int(src.shape[-2]), int(src.shape[-1])))
        flips.append(flipped)
    m, n = int(node.shape[-2]), int(node.shape[-1])
    out_shape = tuple(node.shape)
    merged_out = _merged(b, b.empty(out_shape), out_shape)
    count = tensor.dim(operands[0], b.index(0))
    loop = scf.ForOp(b.index(0), count, b.index(1), [merged_out])
    with ir.InsertionPoint(loop.body):
        i = loop.induction_variable
        a_i, b_i = (_matrix(b, v, i, *s) for v, s in zip(operands, shapes))
        product = b.matmul(a_i, b_i, (m, n), flips[0], flips[1])
        acc = loop.inner_iter_args[0]
        dynamic = ir.ShapedType.get_dynamic_size()
        stored = tensor.insert_slice(product, acc, [i], [], [], [dynamic, 0, 0], [1, m, n], [1, 1, 1])
        scf.yield_([stored])
    result = loop.results[0]
    if len(out_shape) == 3:
        return result
    rank = len(out_shape)
    sizes = b.sizes(out_shape)
    static = [ir.ShapedType.get_dynamic_size() if isinstance(s, ir.Value) else s for s in sizes]
    kind = ir.RankedTensorType.get(static, b.element)
    dynamic_sizes = [s for s in sizes if isinstance(s, ir.Value)]
    return tensor.expand_shape(kind, result, [list(range(rank - 2)), [rank - 2], [rank - 1]], dynamic_sizes, static)
