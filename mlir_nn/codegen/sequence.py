"""Lowerings of the sequence-model ops (``mlir_nn.ir.sequence_ops``), each one linalg.generic.

Gathers and their scatter-add gradients are reductions over the indexed axis that keep the
element whose position equals the index (``select``, never a multiply, so other rows' inf
or NaN do not leak): every read goes through an affine map inside the operand's bounds,
whatever the index values, and repeated indices add up in the scatter.
"""

from __future__ import annotations

from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
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
    x = b.tensor_of(xs[0], node.inputs[0].shape)
    dynamic, static = _sizes(b, node.shape)
    kind = ir.RankedTensorType.get(static, b.element)
    return tensor.extract_slice(kind, x, [], dynamic, [], node.attr("start"), static, node.attr("step"))


def _slice_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """Zeros with the gradient inserted at the strided box."""
    shape = node.inputs[0].shape
    dynamic, static = _sizes(b, shape)
    return tensor.insert_slice(b.tensor_of(xs[0], shape), b.filled(node.shape, 0.0), [], dynamic, [],
                               node.attr("start"), static, node.attr("step"))


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


def _take(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[pre, i.., post] = sum_v (index[i..] == v) ? x[pre, v, post] : 0, v the last loop."""
    x_shape, index_shape = node.inputs[0].shape, node.inputs[1].shape
    x, index = b.tensor_of(xs[0], x_shape), b.tensor_of(xs[1], index_shape)
    axis, rank, ri = int(node.attr("axis")), len(node.shape), len(index_shape)
    v = rank
    x_dims = list(range(axis)) + [v] + list(range(axis + ri, rank))
    maps = [ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in x_dims]),
            ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in range(axis, axis + ri)])]
    out_map = ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in range(rank)])
    return b.reduce(node.shape, [x, index], maps, out_map, [PARALLEL] * rank + [REDUCTION],
                    _selected(b, v, int(x_shape[axis])))


def _take_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[pre, v, post] = sum_i.. (index[i..] == v) ? g[pre, i.., post] : 0."""
    g_shape, index_shape = node.inputs[0].shape, node.inputs[1].shape
    g, index = b.tensor_of(xs[0], g_shape), b.tensor_of(xs[1], index_shape)
    axis, rank, ri = int(node.attr("axis")), len(node.shape), len(index_shape)
    loops = rank + ri  # output dims, then one reduction loop per index dim
    rows = list(range(rank, loops))
    g_dims = list(range(axis)) + rows + list(range(axis + 1, rank))
    maps = [ir.AffineMap.get(loops, 0, [_dim(d) for d in g_dims]),
            ir.AffineMap.get(loops, 0, [_dim(d) for d in rows])]
    out_map = ir.AffineMap.get(loops, 0, [_dim(d) for d in range(rank)])
    return b.reduce(node.shape, [g, index], maps, out_map, [PARALLEL] * rank + [REDUCTION] * ri,
                    _selected(b, axis, int(node.attr("size"))))


def _gather(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[.., i, ..] = sum_v (index[.., i, ..] == v) ? x[.., v, ..] : 0."""
    x_shape = node.inputs[0].shape
    x, index = b.tensor_of(xs[0], x_shape), b.tensor_of(xs[1], node.shape)
    axis, rank = int(node.attr("axis")), len(node.shape)
    x_dims = [rank if d == axis else d for d in range(rank)]
    maps = [ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in x_dims]),
            ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in range(rank)])]
    return b.reduce(node.shape, [x, index], maps, maps[1], [PARALLEL] * rank + [REDUCTION],
                    _selected(b, rank, int(x_shape[axis])))


def _gather_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[.., v, ..] = sum_i (index[.., i, ..] == v) ? g[.., i, ..] : 0."""
    shape = node.inputs[0].shape
    g, index = b.tensor_of(xs[0], shape), b.tensor_of(xs[1], shape)
    axis, rank = int(node.attr("axis")), len(node.shape)
    read = ir.AffineMap.get(rank + 1, 0, [_dim(rank if d == axis else d) for d in range(rank)])
    out_map = ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in range(rank)])
    return b.reduce(node.shape, [g, index], [read, read], out_map, [PARALLEL] * rank + [REDUCTION],
                    _selected(b, axis, int(node.attr("size"))))


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


def _bmm(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """Loops (batch.., m, n, k): a[.., m, k] * b[.., k, n] summed over k."""
    rank = len(node.shape)
    lhs, rhs = (b.tensor_of(v, i.shape) for v, i in zip(xs, node.inputs))
    batch, m, n, k = list(range(rank - 2)), rank - 2, rank - 1, rank
    maps = [ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in batch + [m, k]]),
            ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in batch + [k, n]])]
    out_map = ir.AffineMap.get(rank + 1, 0, [_dim(d) for d in batch + [m, n]])
    return b.reduce(node.shape, [lhs, rhs], maps, out_map, [PARALLEL] * rank + [REDUCTION], arith.mulf)


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
    "bmm": _bmm,
}
