"""Lowerings of the ops that work row by row along one axis: softmax and LayerNorm, each way.

Each is a few linalg ops over the whole tensor: reductions into per-row statistics (a
kept axis of size 1, summed in float64 for float32 data where the builder's ``wide_sums``
says so) and one element-wise pass that reads them broadcast along the row.

* softmax: max, then exp(x - max) element-wise (a pass of its own, so it vectorizes),
  their sum, and the division in place;
* softmax_grad: y * (g - sum(y * g)): one reduction, one pass, no exponentials;
* causal (both): a select on the element's indices (column > row) hides the entries above the
  diagonal of the last two axes, whatever they hold, and writes zeros there;
* layer_norm: mean, then the sum of squared deviations, r = 1 / sqrt(var + eps) per
  row, and (x - mean) * r;
* layer_norm_grad: the statistics again (from x, not stored by the forward), the sums of
  g and of g * (x - mean), and r * (g - mean(g) - (x - mean) r^2 mean(g (x - mean))).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, math

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
from mlir_nn.codegen.maps import broadcast_map, identity_map, reduction_map
from mlir_nn.ir import Node
from mlir_nn.ir.shapes import Shape


class Rows:
    """Maps for reducing a tensor along one axis into a kept size-1 axis (per-row statistics)."""

    def __init__(self, shape: Shape, axis: int) -> None:
        rank = len(shape)
        self.shape, self.kept = shape, tuple(1 if i == axis else d for i, d in enumerate(shape))
        self.whole, self.row = identity_map(rank), broadcast_map(self.kept, shape)
        self.out = reduction_map(rank, (axis,), True)
        self.iterators = [REDUCTION if i == axis else PARALLEL for i in range(rank)]
        self.length = shape[axis]

    def reduce(self, b: FunctionBuilder, operands: list[ir.Value], maps: list[ir.AffineMap], fn,
               **kw) -> ir.Value:
        return b.reduce(self.kept, operands, maps, self.out, self.iterators, fn, **kw)

    def per_row(self, b: FunctionBuilder, operands: list[ir.Value], fn) -> ir.Value:
        """``fn`` of per-row values (each of the kept shape), element-wise."""
        return b.elementwise(self.kept, operands, [self.kept] * len(operands), fn)

    def max_and_sum_exp(self, b: FunctionBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """max(x) and sum(exp(x - max)) along the axis: the stable log-sum-exp's two passes."""
        m = self.reduce(b, [x], [self.whole], lambda v: v, init=float("-inf"), combine=arith.maximumf)
        s = self.reduce(b, [x, m], [self.whole, self.row], lambda v, mv: math.exp(arith.subf(v, mv)))
        return m, s


def _above_diagonal(rank: int) -> ir.Value:
    """In a linalg body over a tensor of ``rank``: its column index > its row index (last two axes)."""
    return arith.cmpi(arith.CmpIPredicate.ugt, linalg.IndexOp(rank - 1).result, linalg.IndexOp(rank - 2).result)


def _softmax(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, int(node.attr("axis")))
    x = b.tensor_of(xs[0], node.shape)
    if node.attr("causal", False):  # -inf above the diagonal: not in the max, exp 0 (maxnumf: LLVM
        # vectorizes its reduction with the select, not maximumf's; a NaN in a row still makes the row NaN)
        rank = len(node.shape)
        m = rows.reduce(b, [x], [rows.whole], lambda v: arith.select(_above_diagonal(rank), b.scalar(float("-inf")), v),
                        init=float("-inf"), combine=arith.maxnumf)
        e = b.elementwise(node.shape, [x, m], [node.shape, rows.kept], lambda v, mv: arith.select(
            _above_diagonal(rank), b.scalar(0.0), math.exp(arith.subf(v, mv))))
    else:
        m = rows.reduce(b, [x], [rows.whole], lambda v: v, init=float("-inf"), combine=arith.maximumf)
        e = b.elementwise(node.shape, [x, m], [node.shape, rows.kept], lambda v, mv: math.exp(arith.subf(v, mv)))
    s = rows.reduce(b, [e], [rows.whole], lambda v: v)
    return b.elementwise(node.shape, [e, s], [node.shape, rows.kept], arith.divf, init=e)


def _softmax_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, int(node.attr("axis")))
    y, g = (b.tensor_of(v, node.shape) for v in xs)
    if not node.attr("causal", False):
        total = rows.reduce(b, [y, g], [rows.whole, rows.whole], arith.mulf)
        return b.elementwise(node.shape, [y, g, total], [node.shape, node.shape, rows.kept],
                             lambda yv, gv, t: arith.mulf(yv, arith.subf(gv, t)))
    rank = len(node.shape)  # g read as 0 above the diagonal, zeros there
    total = rows.reduce(b, [y, g], [rows.whole, rows.whole],
                        lambda yv, gv: arith.select(_above_diagonal(rank), b.scalar(0.0), arith.mulf(yv, gv)))
    return b.elementwise(node.shape, [y, g, total], [node.shape, node.shape, rows.kept],
                         lambda yv, gv, t: arith.select(_above_diagonal(rank), b.scalar(0.0),
                                                        arith.mulf(yv, arith.subf(gv, t))))


def _statistics(b: FunctionBuilder, rows: Rows, x: ir.Value, eps: float) -> tuple[ir.Value, ir.Value]:
    """Per-row mean and 1 / sqrt(var + eps) of ``x`` (biased variance, two passes)."""
    count = b.count([rows.length])
    mean = rows.per_row(b, [rows.reduce(b, [x], [rows.whole], lambda v: v)], lambda t: arith.divf(t, count))

    def squared(v: ir.Value, m: ir.Value) -> ir.Value:
        d = arith.subf(v, m)
        return arith.mulf(d, d)

    squares = rows.reduce(b, [x, mean], [rows.whole, rows.row], squared)
    rstd = rows.per_row(b, [squares], lambda s: arith.divf(
        b.scalar(1.0), math.sqrt(arith.addf(arith.divf(s, count), b.scalar(eps)))))
    return mean, rstd


def _layer_norm(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, len(node.shape) - 1)
    x = b.tensor_of(xs[0], node.shape)
    mean, rstd = _statistics(b, rows, x, float(node.attr("eps")))
    return b.elementwise(node.shape, [x, mean, rstd], [node.shape, rows.kept, rows.kept],
                         lambda v, m, r: arith.mulf(arith.subf(v, m), r))


def _layer_norm_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, len(node.shape) - 1)
    x, g = (b.tensor_of(v, node.shape) for v in xs)
    mean, rstd = _statistics(b, rows, x, float(node.attr("eps")))
    count = b.count([rows.length])
    sum_g = rows.reduce(b, [g], [rows.whole], lambda v: v)
    sum_gx = rows.reduce(b, [g, x, mean], [rows.whole, rows.whole, rows.row],
                         lambda gv, v, m: arith.mulf(gv, arith.subf(v, m)))

    def coefficients(r: ir.Value, s: ir.Value, sx: ir.Value) -> tuple[ir.Value, ir.Value]:
        return arith.divf(s, count), arith.divf(arith.mulf(arith.mulf(r, r), sx), count)

    shift = rows.per_row(b, [rstd, sum_g, sum_gx], lambda r, s, sx: coefficients(r, s, sx)[0])
    slope = rows.per_row(b, [rstd, sum_g, sum_gx], lambda r, s, sx: coefficients(r, s, sx)[1])

    def grad(v: ir.Value, gv: ir.Value, m: ir.Value, r: ir.Value, c: ir.Value, k: ir.Value) -> ir.Value:
        return arith.mulf(r, arith.subf(arith.subf(gv, c), arith.mulf(arith.subf(v, m), k)))

    kept = rows.kept
    return b.elementwise(node.shape, [x, g, mean, rstd, shift, slope],
                         [node.shape, node.shape, kept, kept, kept, kept], grad)


ROW_LOWERINGS = {"softmax": _softmax, "softmax_grad": _softmax_grad, "layer_norm": _layer_norm,
                 "layer_norm_grad": _layer_norm_grad}
