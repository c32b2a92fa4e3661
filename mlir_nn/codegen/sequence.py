"""Lowerings of the sequence-model ops (``mlir_nn.ir.sequence_ops``), each one linalg.generic
(``bmm``: a loop of 2-D products, ``batched_products``).

Gathers and their scatter-add gradients are reductions over the indexed axis that keep the
element whose position equals the index (``select``, never a multiply, so other rows' inf
or NaN do not leak): every read goes through an affine map inside the operand's bounds,
whatever the index values, and repeated indices add up in the scatter.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.batched_products import lower_bmm
from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
from mlir_nn.codegen.joined_slices import note_piece
from mlir_nn.codegen.maps import dims_map, identity_map
from mlir_nn.codegen.shaped import dim_sizes
from mlir_nn.codegen.windows import place
from mlir_nn.ir import Node

Rule = Callable[[FunctionBuilder, Node, list[Operand]], ir.Value]


def _dim(d: int) -> ir.AffineExpr:
    return ir.AffineDimExpr.get(d)


def _sizes(b: FunctionBuilder, shape: tuple) -> tuple[list[ir.Value], list[int]]:
    """Dynamic size operands and static sizes (the batch symbol dynamic) of a slice op."""
    sizes = b.sizes(shape)
    return ([v for v in sizes if isinstance(v, ir.Value)],
            [ir.ShapedType.get_dynamic_size() if isinstance(v, ir.Value) else v for v in sizes])


def _slice(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """A strided box: a view (extract_slice) with strided views, else a copy reading x[start + i * step]."""
    x = b.tensor_of(xs[0], node.inputs[0].shape)
    if not b.strided_copies:
        return _slice_gather(b, x, node)
    dynamic, static = _sizes(b, node.shape)
    kind = ir.RankedTensorType.get(static, b.element)
    return tensor.extract_slice(kind, x, [], dynamic, [], node.attr("start"), static, node.attr("step"))


def _slice_gather(b: FunctionBuilder, x: ir.Value, node: Node) -> ir.Value:
    """out[i] = x[start + i * step] as one linalg.generic reading ``x`` by tensor.extract."""
    rank = len(node.shape)

    @linalg.generic([], [b.empty(node.shape)], [identity_map(rank)], [PARALLEL] * rank)
    def result(_out: ir.Value) -> ir.Value:
        at = []
        for d, (start, step) in enumerate(zip(node.attr("start"), node.attr("step"))):
            i = linalg.IndexOp(d).result
            if int(step) != 1:
                i = arith.muli(i, b.index(int(step)))
            at.append(arith.addi(i, b.index(int(start))) if int(start) else i)
        return tensor.extract(x, at)

    return result


def _slice_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """Zeros with the gradient placed at the strided box (``windows.place``: an insert_slice with strided
    views, else a gather)."""
    shape = node.inputs[0].shape
    x = b.tensor_of(xs[0], shape)
    note_piece(b, node, x)
    return place(b, x, shape, node.shape, node.attr("start"), node.attr("step"), 0.0)


def _position(b: FunctionBuilder, loop: int) -> ir.Value:
    """The induction variable of ``loop`` as a float of the step's dtype."""
    i64 = ir.IntegerType.get_signless(64)
    return arith.sitofp(b.element, arith.index_cast(i64, linalg.IndexOp(loop).result))


def _picks(b: FunctionBuilder, index: ir.Value, loop: int, size: int) -> ir.Value:
    """i1: ``index`` names position ``loop`` of an axis of ``size`` (negative indices count from the end)."""
    here = _position(b, loop)
    eq = arith.CmpFPredicate.OEQ
    return arith.ori(arith.cmpf(eq, index, here), arith.cmpf(eq, index, arith.subf(here, b.scalar(float(size)))))


def _selected(b: FunctionBuilder, loop: int, size: int) -> Callable[[ir.Value, ir.Value], ir.Value]:
    return lambda v, index: arith.select(_picks(b, index, loop, size), v, b.scalar(0.0))


def _plain_add(total: ir.Value, value: ir.Value) -> ir.Value:
    """The sum of a selection: in the step's dtype (one term, or repeated indices' few, per element)."""
    return arith.addf(total, value)


def _clamped(b: FunctionBuilder, index: ir.Value, size: int) -> ir.Value:
    """A float index as an ``index`` value inside [0, size): negative ones count from the end,
    out-of-range ones (rejected before any call when they are step arguments) are clamped."""
    i64 = ir.IntegerType.get_signless(64)
    raw = arith.fptosi(i64, index)
    zero, top = arith.constant(i64, 0), arith.constant(i64, size - 1)
    wrapped = arith.select(arith.cmpi(arith.CmpIPredicate.slt, raw, zero), arith.addi(raw, arith.constant(i64, size)),
                           raw)
    return arith.index_cast(ir.IndexType.get(), arith.minsi(arith.maxsi(wrapped, zero), top))


def _take(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[pre, i.., post] = x[pre, index[i..], post]: one read per element, at a clamped row."""
    x_shape, index_shape = node.inputs[0].shape, node.inputs[1].shape
    x, index = b.tensor_of(xs[0], x_shape), b.tensor_of(xs[1], index_shape)
    axis, rank, ri = int(node.attr("axis")), len(node.shape), len(index_shape)
    index_map = ir.AffineMap.get(rank, 0, [_dim(d) for d in range(axis, axis + ri)])

    @linalg.generic([index], [b.empty(node.shape)], [index_map, identity_map(rank)], [PARALLEL] * rank)
    def result(i: ir.Value, _out: ir.Value) -> ir.Value:
        at = [linalg.IndexOp(d).result for d in range(axis)] + [_clamped(b, i, int(x_shape[axis]))]
        return tensor.extract(x, at + [linalg.IndexOp(d).result for d in range(axis + ri, rank)])

    return result


def _rows_of(value: ir.Value, rank: int, keep_last: bool) -> ir.Value:
    """``value`` with its first ``rank`` axes collapsed into one (the last axis kept when asked)."""
    kind = ir.RankedTensorType(value.type)
    if rank == 1 and not (keep_last and kind.rank > 2):
        return value
    i64 = ir.IntegerType.get_signless(64)
    groups = [list(range(rank))] + ([[rank]] if keep_last else [])
    static = kind.shape[:rank]
    rows = ir.ShapedType.get_dynamic_size() if any(d < 0 for d in static) else int(np.prod(static))
    shape = [rows] + ([kind.shape[rank]] if keep_last else [])
    reassociation = ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])
    return tensor.collapse_shape(ir.RankedTensorType.get(shape, kind.element_type), value, reassociation)


def _take_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """Scatter-add of rows into a table (axis 0 of a 2-D result): one_hot(index)^T @ g, a product
    the CPU schedule blocks; other axes: out[pre, v, post] = sum_i.. (index[i..] == v) ? g[pre, i.., post]."""
    g_shape, index_shape = node.inputs[0].shape, node.inputs[1].shape
    g, index = b.tensor_of(xs[0], g_shape), b.tensor_of(xs[1], index_shape)
    axis, rank, ri = int(node.attr("axis")), len(node.shape), len(index_shape)
    size = int(node.attr("size"))
    if axis == 0 and rank == 2:
        flat, rows = _rows_of(index, ri, False), _rows_of(g, ri, True)
        count = dim_sizes(flat)[0]
        picks = tensor.empty([count if isinstance(count, ir.Value) else count, size], b.element)

        @linalg.generic([flat], [picks], [dims_map(2, [0]), identity_map(2)], [PARALLEL] * 2)
        def one_hot(i: ir.Value, _out: ir.Value) -> ir.Value:
            return arith.select(_picks(b, i, 1, size), b.scalar(1.0), b.scalar(0.0))

        return b.matmul(one_hot, rows, node.shape, True, False)
    loops = rank + ri
    rows_loops = list(range(axis + 1, axis + 1 + ri))
    post = list(range(axis + 1 + ri, loops))
    maps = [ir.AffineMap.get(loops, 0, [_dim(d) for d in list(range(axis)) + rows_loops + post]),
            ir.AffineMap.get(loops, 0, [_dim(d) for d in rows_loops])]
    out_map = ir.AffineMap.get(loops, 0, [_dim(d) for d in list(range(axis + 1)) + post])
    iterators = [PARALLEL] * (axis + 1) + [REDUCTION] * ri + [PARALLEL] * len(post)
    return b.reduce(node.shape, [g, index], maps, out_map, iterators, _selected(b, axis, size), combine=_plain_add)


def _gather(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[.., i, ..] = sum_v (index[.., i, ..] == v) ? x[.., v, ..] : 0."""
    x_shape = node.inputs[0].shape
    x, index = b.tensor_of(xs[0], x_shape), b.tensor_of(xs[1], node.shape)
    axis, rank = int(node.attr("axis")), len(node.shape)
    x_dims = [rank if d == axis else d for d in range(rank)]
    maps = [ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in x_dims]),
            ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in range(rank)])]
    return b.reduce(node.shape, [x, index], maps, maps[1], [PARALLEL] * rank + [REDUCTION],
                    _selected(b, rank, int(x_shape[axis])), combine=_plain_add)


def _gather_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[.., v, ..] = sum_i (index[.., i, ..] == v) ? g[.., i, ..] : 0."""
    shape = node.inputs[0].shape
    g, index = b.tensor_of(xs[0], shape), b.tensor_of(xs[1], shape)
    axis, rank = int(node.attr("axis")), len(node.shape)
    read = ir.AffineMap.get(rank + 1, 0, [_dim(rank if d == axis else d) for d in range(rank)])
    out_map = ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in range(rank)])
    return b.reduce(node.shape, [g, index], [read, read], out_map, [PARALLEL] * rank + [REDUCTION],
                    _selected(b, axis, int(node.attr("size"))),
                    combine=_plain_add)


def _where(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    def pick(cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return arith.select(arith.cmpf(arith.CmpFPredicate.UNE, cond, b.scalar(0.0)), x, y)

    return b.elementwise(node.shape, xs, [i.shape for i in node.inputs], pick)


def _compare(predicate: arith.CmpFPredicate) -> Rule:
    def rule(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
        def mask(x: ir.Value, y: ir.Value) -> ir.Value:
            return arith.select(arith.cmpf(predicate, x, y), b.scalar(1.0), b.scalar(0.0))

        return b.elementwise(node.shape, xs, [i.shape for i in node.inputs], mask)

    return rule


SEQUENCE_LOWERINGS: dict[str, Rule] = {
    "slice": _slice,
    "slice_grad": _slice_grad,
    "take": _take,
    "take_grad": _take_grad,
    "gather": _gather,
    "gather_grad": _gather_grad,
    "where": _where,
    "lt": _compare(arith.CmpFPredicate.OLT),
    "le": _compare(arith.CmpFPredicate.OLE),
    "gt": _compare(arith.CmpFPredicate.OGT),
    "ge": _compare(arith.CmpFPredicate.OGE),
    "ne": _compare(arith.CmpFPredicate.UNE),
    "bmm": lower_bmm,
}
