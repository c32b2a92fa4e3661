"""One lowering rule per op of the registry: Node + operands -> tensor Value (or float).

A rule is ``rule(b, node, operands)`` where ``b`` is the FunctionBuilder and ``operands``
are the values of ``node.inputs`` (tensor Values, or floats for ``const`` inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mlir import ir
from mlir.dialects import arith, math, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen import philox
from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
from mlir_nn.codegen.joined_slices import joined
from mlir_nn.codegen.maps import dims_map, identity_map, reduction_map
from mlir_nn.codegen.reshapes import view_reshape
from mlir_nn.codegen.row_ops import ROW_LOWERINGS, Rows
from mlir_nn.codegen.sequence import SEQUENCE_LOWERINGS
from mlir_nn.codegen.tensor_types import tensor_type
from mlir_nn.codegen.windows import WINDOW_LOWERINGS, permuted
from mlir_nn.ir import Node
from mlir_nn.ir.ops import sum_to_axes

Rule = Callable[[FunctionBuilder, Node, list[Operand]], ir.Value | float]
OGT = arith.CmpFPredicate.OGT


def _ewise(fn: Callable[..., ir.Value]) -> Rule:
    """Rule for an op computed element by element (with numpy broadcasting)."""

    def rule(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
        return b.elementwise(node.shape, xs, [i.shape for i in node.inputs], fn)

    return rule


def _add(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """x + y; a sum of slices placed in disjoint boxes as insertions (``joined_slices``)."""
    value = joined(b, node, xs)
    return b.elementwise(node.shape, xs, [i.shape for i in node.inputs], arith.addf) if value is None else value


def _pow(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    e = float(node.attr("exponent"))
    if e == 2.0:
        return b.elementwise(node.shape, xs, [node.inputs[0].shape], lambda x: arith.mulf(x, x))
    return b.elementwise(node.shape, xs, [node.inputs[0].shape], lambda x: math.powf(x, b.scalar(e)))


def _sigmoid(b: FunctionBuilder, x: ir.Value) -> ir.Value:
    """Stable sigmoid: exp only sees -|x|; x >= 0 ? 1 / (1 + e) : e / (1 + e)."""
    e = math.exp(arith.negf(math.absf(x)))
    denom = arith.addf(b.scalar(1.0), e)
    positive = arith.cmpf(arith.CmpFPredicate.OGE, x, b.scalar(0.0))
    return arith.select(positive, arith.divf(b.scalar(1.0), denom), arith.divf(e, denom))


def _relu_grad(b: FunctionBuilder, x: ir.Value, g: ir.Value) -> ir.Value:
    return arith.select(arith.cmpf(OGT, x, b.scalar(0.0)), g, b.scalar(0.0))


def _fused_matmul(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """op(a) @ op(b) of a matmul-based node, reading through 2-D transposes of its operands.

    A transpose operand's own value is still computed (and later removed as dead code
    when the product was its only user); the product reads the untransposed tensor.
    """
    operands, flags = [], []
    for value, src, flag in zip(xs[:2], node.inputs[:2], ("transpose_a", "transpose_b")):
        flipped = bool(node.attr(flag))
        if src.op == "transpose" and tuple(src.attr("perm")) == (1, 0) and src.inputs[0].op != "const":
            value = b.source_of_transpose[src]
            flipped = not flipped
        operands.append(value)
        flags.append(flipped)
    return b.matmul(operands[0], operands[1], node.shape, flags[0], flags[1])


def _transpose(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    x = b.tensor_of(xs[0], node.inputs[0].shape)
    b.source_of_transpose[node] = x
    return permuted(b, x, node.inputs[0].shape, tuple(node.attr("perm")))


def _reshape(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    x = b.tensor_of(xs[0], node.inputs[0].shape)
    view = view_reshape(b, x, node.inputs[0].shape, node.shape)  # issue 22: merges and splits as views
    if view is not None:
        return view
    index = ir.IndexType.get()
    sizes = [s if isinstance(s, ir.Value) else b.index(s) for s in b.sizes(node.shape)]
    shape = tensor.from_elements(ir.RankedTensorType.get([len(sizes)], index), sizes)
    return tensor.reshape(tensor_type(node.shape, node.dtype), x, shape)


def _broadcast_to(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    return b.elementwise(node.shape, xs, [node.inputs[0].shape], lambda v: v)


def _sum_to(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    src = node.inputs[0].shape
    x = b.tensor_of(xs[0], src)
    axes, lead = sum_to_axes(src, node.shape)
    out = [None if lead + j in axes else lead + j for j in range(len(node.shape))]
    iterators = [REDUCTION if i in axes else PARALLEL for i in range(len(src))]
    return b.reduce(node.shape, [x], [identity_map(len(src))], dims_map(len(src), out), iterators, lambda v: v)


def _over_axes(b: FunctionBuilder, node: Node, xs: list[Operand], **combine: Any) -> ir.Value:
    """A reduction over the node's ``axes`` (``keepdims`` honoured); a sum unless ``combine`` says."""
    src = node.inputs[0].shape
    x = b.tensor_of(xs[0], src)
    axes = tuple(node.attr("axes"))
    iterators = [REDUCTION if i in axes else PARALLEL for i in range(len(src))]
    out_map = reduction_map(len(src), axes, bool(node.attr("keepdims")))
    return b.reduce(node.shape, [x], [identity_map(len(src))], out_map, iterators, lambda v: v, **combine)


def _sum(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    return _over_axes(b, node, xs)


def _max(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    return _over_axes(b, node, xs, init=float("-inf"), combine=arith.maximumf)


def _eq(b: FunctionBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, x, y), b.scalar(1.0), b.scalar(0.0))


def _log_softmax(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, int(node.attr("axis")))
    x = b.tensor_of(xs[0], node.shape)
    m, s = rows.max_and_sum_exp(b, x)
    lowest = b.scalar(float(np.finfo(node.dtype).min))  # x - max may overflow to -inf: clamp it

    def log_probability(v: ir.Value, mv: ir.Value, sv: ir.Value) -> ir.Value:
        return arith.maximumf(arith.subf(arith.subf(v, mv), math.log(sv)), lowest)

    return b.elementwise(node.shape, [x, m, s], [node.shape, rows.kept, rows.kept], log_probability)


def _log_softmax_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, int(node.attr("axis")))
    y, g = (b.tensor_of(v, node.shape) for v in xs)
    total = rows.reduce(b, [g], [rows.whole], lambda v: v)
    return b.elementwise(node.shape, [y, g, total], [node.shape, node.shape, rows.kept],
                         lambda yv, gv, t: arith.subf(gv, arith.mulf(math.exp(yv), t)))


def _one_hot(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    labels = b.tensor_of(xs[0], node.inputs[0].shape)
    i64 = ir.IntegerType.get_signless(64)

    @linalg.generic([labels], [b.empty(node.shape)], [dims_map(2, [0]), identity_map(2)], [PARALLEL] * 2)
    def result(label: ir.Value, _out: ir.Value) -> ir.Value:
        column = arith.sitofp(b.element, arith.index_cast(i64, linalg.IndexOp(1).result))
        return _eq(b, label, column)

    return result


def _softmax_xent_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rows = Rows(node.shape, 1)
    y, p = (b.tensor_of(v, node.shape) for v in xs)
    mass = rows.reduce(b, [p], [rows.whole], lambda v: v)
    scale = arith.divf(b.scalar(float(node.attr("scale"))), b.count([node.shape[0]]))

    def grad(yv: ir.Value, pv: ir.Value, total: ir.Value) -> ir.Value:
        return arith.mulf(arith.subf(arith.mulf(math.exp(yv), total), pv), scale)

    return b.elementwise(node.shape, [y, p, mass], [node.shape, node.shape, rows.kept], grad)


def _stack(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """out[i, ...] = xs[i][...]: each element picks its operand by the first index."""
    rank, count = len(node.shape), len(xs)
    parts = [b.tensor_of(v, node.inputs[0].shape) for v in xs]
    part_map = dims_map(rank, list(range(1, rank)))

    @linalg.generic(parts, [b.empty(node.shape)], [part_map] * count + [identity_map(rank)], [PARALLEL] * rank)
    def result(*args: ir.Value) -> ir.Value:
        *values, _out = args
        row = linalg.IndexOp(0).result
        chosen = values[-1]
        for i in range(count - 2, -1, -1):
            chosen = arith.select(arith.cmpi(arith.CmpIPredicate.eq, row, b.index(i)), values[i], chosen)
        return chosen

    return result


def _index(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    rank = len(node.shape)
    x = b.tensor_of(xs[0], node.inputs[0].shape)
    exprs = [ir.AffineConstantExpr.get(int(node.attr("index")))] + [ir.AffineDimExpr.get(d) for d in range(rank)]

    @linalg.generic([x], [b.empty(node.shape)], [ir.AffineMap.get(rank, 0, exprs), identity_map(rank)],
                    [PARALLEL] * rank)
    def result(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return result


def _mean(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    total = _sum(b, node, xs)
    count = b.count([node.inputs[0].shape[a] for a in node.attr("axes")])
    return b.elementwise(node.shape, [total], [node.shape], lambda v: arith.divf(v, count))


def _mean_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    count = b.count([node.shape[a] for a in node.attr("axes")])
    return b.elementwise(node.shape, xs, [node.inputs[0].shape], lambda g: arith.divf(g, count))


def _mse(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    shape = node.inputs[0].shape
    rank = len(shape)
    p, y = (b.tensor_of(v, shape) for v in xs)

    def square_diff(pv: ir.Value, yv: ir.Value) -> ir.Value:
        d = arith.subf(pv, yv)
        return arith.mulf(d, d)

    total = b.reduce((), [p, y], [identity_map(rank)] * 2, dims_map(rank, []), [REDUCTION] * rank, square_diff)
    count = b.count(shape)
    return b.elementwise((), [total], [()], lambda v: arith.divf(v, count))


def _mse_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    count = b.count(node.shape)  # reference divides by max(numel, 1); the batch is never empty

    def grad(p: ir.Value, y: ir.Value, g: ir.Value) -> ir.Value:
        scale = arith.divf(arith.mulf(b.scalar(2.0), g), count)
        return arith.mulf(arith.subf(p, y), scale)

    return b.elementwise(node.shape, xs, [i.shape for i in node.inputs], grad)


def _linear(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    product = _fused_matmul(b, node, xs)
    relu = node.attr("activation", "none") == "relu"

    def epilogue(acc: ir.Value, bias: ir.Value) -> ir.Value:
        s = arith.addf(acc, bias)
        return arith.maximumf(s, b.scalar(0.0)) if relu else s

    return b.elementwise(node.shape, [product, xs[2]], [node.shape, node.inputs[2].shape], epilogue, init=product)


def _gemm(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """beta * c +- alpha * product, alpha and beta folded constants or 0-d tensors read in the epilogue."""
    product = _fused_matmul(b, node, xs)
    shapes = [i.shape for i in node.inputs[2:]]
    return b.scaled_update(node.shape, product, xs[2:], shapes, node.attr("subtract", False))


def _matmul_relu_grad(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    product = _fused_matmul(b, node, xs)
    return b.elementwise(node.shape, [product, xs[2]], [node.shape, node.inputs[2].shape],
                         lambda acc, z: _relu_grad(b, z, acc), init=product)


def _sign(b: FunctionBuilder, x: ir.Value) -> ir.Value:
    negative = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, b.scalar(0.0)), b.scalar(-1.0), b.scalar(0.0))
    return arith.select(arith.cmpf(OGT, x, b.scalar(0.0)), b.scalar(1.0), negative)


def _softplus(b: FunctionBuilder, x: ir.Value) -> ir.Value:
    """max(x, 0) + log1p(exp(-|x|)): exp only sees non-positive arguments."""
    return arith.addf(arith.maximumf(x, b.scalar(0.0)), math.log1p(math.exp(arith.negf(math.absf(x)))))


# ops lowered by one ``FunctionBuilder.elementwise`` of their operands (``add`` unless its operands
# are placed slices): one read only by another of its shape is computed in that one's body
ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "neg", "pow", "relu", "tanh", "sigmoid", "exp", "log", "sqrt",
                         "relu_grad", "tanh_grad", "sigmoid_grad", "eq", "sign", "abs", "maximum", "minimum",
                         "softplus", "erf"})

LOWERINGS: dict[str, Rule] = {
    "add": _add,
    "sub": _ewise(arith.subf),
    "mul": _ewise(arith.mulf),
    "div": _ewise(arith.divf),
    "neg": _ewise(arith.negf),
    "pow": _pow,
    "relu": lambda b, n, xs: b.elementwise(n.shape, xs, [n.inputs[0].shape],
                                           lambda x: arith.maximumf(x, b.scalar(0.0))),
    "tanh": _ewise(math.tanh),
    "sigmoid": lambda b, n, xs: b.elementwise(n.shape, xs, [n.inputs[0].shape], lambda x: _sigmoid(b, x)),
    "exp": _ewise(math.exp),
    "log": _ewise(math.log),
    "sqrt": _ewise(math.sqrt),
    "relu_grad": lambda b, n, xs: b.elementwise(n.shape, xs, [i.shape for i in n.inputs],
                                                lambda x, g: _relu_grad(b, x, g)),
    "tanh_grad": lambda b, n, xs: b.elementwise(
        n.shape, xs, [i.shape for i in n.inputs],
        lambda y, g: arith.mulf(g, arith.subf(b.scalar(1.0), arith.mulf(y, y)))),
    "sigmoid_grad": lambda b, n, xs: b.elementwise(
        n.shape, xs, [i.shape for i in n.inputs],
        lambda y, g: arith.mulf(arith.mulf(g, y), arith.subf(b.scalar(1.0), y))),
    "matmul": _fused_matmul,
    "transpose": _transpose,
    "reshape": _reshape,
    "broadcast_to": _broadcast_to,
    "sum_to": _sum_to,
    "sum": _sum,
    "mean": _mean,
    "max": _max,
    "eq": lambda b, n, xs: b.elementwise(n.shape, xs, [i.shape for i in n.inputs], lambda x, y: _eq(b, x, y)),
    "log_softmax": _log_softmax,
    "log_softmax_grad": _log_softmax_grad,
    "one_hot": _one_hot,
    **ROW_LOWERINGS,
    "softmax_xent_grad": _softmax_xent_grad,
    "stack": _stack,
    "index": _index,
    "mean_grad": _mean_grad,
    "mse": _mse,
    "mse_grad": _mse_grad,
    "linear": _linear,
    "gemm": _gemm,
    "matmul_relu_grad": _matmul_relu_grad,
    # ------------------------------------------------------------ window ops (issue 22)
    **WINDOW_LOWERINGS,
    # issue 21b: losses and masks
    "sign": lambda b, n, xs: b.elementwise(n.shape, xs, [n.inputs[0].shape], lambda x: _sign(b, x)),
    "abs": _ewise(math.absf),
    "maximum": _ewise(arith.maximumf),
    "minimum": _ewise(arith.minimumf),
    "softplus": lambda b, n, xs: b.elementwise(n.shape, xs, [n.inputs[0].shape], lambda x: _softplus(b, x)),
}


# ---------------------------------------------------------------------------- nn layers (issue 21a)


def _numel(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    dims = [node.inputs[0].shape[a] for a in node.attr("axes")]
    return b.elementwise((), [], [], lambda: b.count(dims))


LOWERINGS.update({
    "erf": _ewise(math.erf),
    "numel": _numel,
    "dropout": philox.dropout,
})


# ---------------------------------------------------------------------------- sequence models (issue 23)
LOWERINGS.update(SEQUENCE_LOWERINGS)
