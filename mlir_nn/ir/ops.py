"""The op registry: one entry per op with its shape rule, NumPy reference and VJP rule.

Adding an op touches only this file. Rules are written against small protocols so that
the same VJP serves eager tensors (evaluated as they are built) and traced ones (which
only build IR nodes):

* ``infer(types, attrs) -> TensorType`` checks operands and returns the result type;
* ``reference(args, attrs, out_shape) -> ndarray`` computes the op with NumPy, where
  ``out_shape`` is the result shape with the batch symbol already bound;
* ``vjp(emit, inputs, out, grad, attrs) -> [grad per input or None]`` builds the
  backward ops by calling ``emit(op, *operands, **attrs)``; operands may be Python
  floats, which become constants of the right dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from mlir_nn.ir import philox
from mlir_nn.ir.shapes import (
    BATCH,
    DTypeError,
    Shape,
    ShapeError,
    broadcast_shapes,
    dtype_name,
    fmt_shape,
    normalize_axes,
    reduced_shape,
)


class TensorType(NamedTuple):
    shape: Shape
    dtype: str


class Handle(Protocol):
    """What VJP rules see of a tensor: its type (values are never inspected)."""

    shape: Shape
    dtype: str


Emit = Callable[..., Any]
Infer = Callable[[list[TensorType], dict[str, Any]], TensorType]
Reference = Callable[[list[np.ndarray], dict[str, Any], tuple[int, ...]], np.ndarray]
Vjp = Callable[[Emit, list[Any], Any, Any, dict[str, Any]], list[Any]]


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int | None  # None: the op takes no tensor operands (leaves)
    infer: Infer
    reference: Reference | None
    vjp: Vjp | None
    doc: str


OPS: dict[str, OpDef] = {}


def register(name: str, arity: int | None, infer: Infer, reference: Reference | None,
             vjp: Vjp | None, doc: str) -> None:
    """Add one op to the registry."""
    if name in OPS:
        raise ValueError(f"op {name!r} is registered twice")
    OPS[name] = OpDef(name, arity, infer, reference, vjp, doc)


def op_def(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") from None


# ---------------------------------------------------------------------------- helpers


def same_dtype(op: str, types: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        shown = ", ".join(f"{fmt_shape(t.shape)}:{t.dtype}" for t in types)
        raise DTypeError(f"{op}: operands have different dtypes ({shown}); expected one dtype")
    return dtypes.pop()


def sum_to(emit: Emit, g: Handle, shape: Shape) -> Handle:
    """Gradient of an implicit broadcast: reduce ``g`` back to ``shape`` if it differs."""
    return g if tuple(g.shape) == tuple(shape) else emit("sum_to", g, shape=shape)


def transpose_of(emit: Emit, x: Handle) -> Handle:
    return emit("transpose", x, perm=(1, 0))


# ---------------------------------------------------------------------------- leaves


def _leaf_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


register("input", None, _leaf_infer, None, None,
         "A step argument (mini-batch data), bound by name at call time.")
register("param", None, _leaf_infer, None, None,
         "State read by the step (weights, optimizer buffers); may be updated.")
register("const", None, lambda types, attrs: TensorType((), attrs["dtype"]),
         lambda args, attrs, shape: np.array(attrs["value"], dtype=attrs["dtype"]), None,
         "A scalar constant; broadcasts against any shape.")


# ---------------------------------------------------------------------------- elementwise


def _binary_infer(op: str) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        dtype = same_dtype(op, types)
        return TensorType(broadcast_shapes(op, types[0].shape, types[1].shape), dtype)

    return infer


def _unary_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return types[0]


def _same_shape_infer(op: str) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        dtype = same_dtype(op, types)
        first = types[0].shape
        for t in types[1:]:
            if t.shape != first:
                raise ShapeError(
                    f"{op}: shapes {fmt_shape(first)} and {fmt_shape(t.shape)} differ; expected equal shapes"
                )
        return TensorType(first, dtype)

    return infer


def _vjp_add(emit, xs, out, g, attrs):
    return [sum_to(emit, g, xs[0].shape), sum_to(emit, g, xs[1].shape)]


def _vjp_sub(emit, xs, out, g, attrs):
    return [sum_to(emit, g, xs[0].shape), sum_to(emit, emit("neg", g), xs[1].shape)]


def _vjp_mul(emit, xs, out, g, attrs):
    a, b = xs
    return [sum_to(emit, emit("mul", g, b), a.shape), sum_to(emit, emit("mul", g, a), b.shape)]


def _vjp_div(emit, xs, out, g, attrs):
    a, b = xs
    ga = emit("div", g, b)
    gb = emit("neg", emit("div", emit("mul", g, out), b))  # -g * a / b^2 == -g * out / b
    return [sum_to(emit, ga, a.shape), sum_to(emit, gb, b.shape)]


register("add", 2, _binary_infer("add"), lambda a, at, s: a[0] + a[1], _vjp_add,
         "x + y with numpy broadcasting.")
register("sub", 2, _binary_infer("sub"), lambda a, at, s: a[0] - a[1], _vjp_sub,
         "x - y with numpy broadcasting.")
register("mul", 2, _binary_infer("mul"), lambda a, at, s: a[0] * a[1], _vjp_mul,
         "x * y with numpy broadcasting.")
register("div", 2, _binary_infer("div"), lambda a, at, s: a[0] / a[1], _vjp_div,
         "x / y with numpy broadcasting.")
register("neg", 1, _unary_infer, lambda a, at, s: -a[0],
         lambda emit, xs, out, g, at: [emit("neg", g)], "-x.")


def _pow_reference(args, attrs, shape):
    x, e = args[0], attrs["exponent"]
    if e == 2.0:
        return x * x
    return np.power(x, np.asarray(e, dtype=x.dtype))


def _vjp_pow(emit, xs, out, g, attrs):
    e = attrs["exponent"]
    if e == 2.0:
        return [emit("mul", g, emit("mul", 2.0, xs[0]))]
    return [emit("mul", g, emit("mul", e, emit("pow", xs[0], exponent=e - 1.0)))]


register("pow", 1, _unary_infer, _pow_reference, _vjp_pow, "x ** exponent (a float attribute).")
register("relu", 1, _unary_infer, lambda a, at, s: np.maximum(a[0], 0),
         lambda emit, xs, out, g, at: [emit("relu_grad", xs[0], g)], "max(x, 0).")
register("tanh", 1, _unary_infer, lambda a, at, s: np.tanh(a[0]),
         lambda emit, xs, out, g, at: [emit("tanh_grad", out, g)], "tanh(x).")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Stable for large |x|: exp only ever sees non-positive arguments.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


register("sigmoid", 1, _unary_infer, lambda a, at, s: _sigmoid(a[0]),
         lambda emit, xs, out, g, at: [emit("sigmoid_grad", out, g)], "1 / (1 + exp(-x)).")
register("exp", 1, _unary_infer, lambda a, at, s: np.exp(a[0]),
         lambda emit, xs, out, g, at: [emit("mul", g, out)], "exp(x).")
def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):  # log(0) = -inf, silently, as compiled code and PyTorch
        return np.log(x)


register("log", 1, _unary_infer, lambda a, at, s: _log(a[0]),
         lambda emit, xs, out, g, at: [emit("div", g, xs[0])], "natural log of x.")
register("sqrt", 1, _unary_infer, lambda a, at, s: np.sqrt(a[0]),
         lambda emit, xs, out, g, at: [emit("div", g, emit("mul", 2.0, out))], "square root of x.")

register("relu_grad", 2, _same_shape_infer("relu_grad"),
         lambda a, at, s: np.where(a[0] > 0, a[1], np.zeros((), a[1].dtype)), None,
         "Backward of relu: grad where x > 0, else 0. Operands: (x, grad).")
register("tanh_grad", 2, _same_shape_infer("tanh_grad"),
         lambda a, at, s: a[1] * (1 - a[0] * a[0]), None,
         "Backward of tanh from its output y: grad * (1 - y^2). Operands: (y, grad).")
register("sigmoid_grad", 2, _same_shape_infer("sigmoid_grad"),
         lambda a, at, s: a[1] * a[0] * (1 - a[0]), None,
         "Backward of sigmoid from its output y: grad * y * (1 - y). Operands: (y, grad).")


# ---------------------------------------------------------------------------- matmul


def _matmul_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    a, b = types
    dtype = same_dtype("matmul", types)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError(
            f"matmul: expected two 2-D operands, got {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}"
        )
    m, k = a.shape[::-1] if attrs.get("transpose_a") else a.shape
    k2, n = b.shape[::-1] if attrs.get("transpose_b") else b.shape
    if k != k2:
        raise ShapeError(
            f"matmul: inner dimensions differ: {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}"
            f"{' (transposed operands)' if attrs.get('transpose_a') or attrs.get('transpose_b') else ''}"
            f"; expected lhs columns ({k}) == rhs rows ({k2})"
        )
    return TensorType((m, n), dtype)


def _matmul_reference(args, attrs, shape):
    a = args[0].T if attrs.get("transpose_a") else args[0]
    b = args[1].T if attrs.get("transpose_b") else args[1]
    return a @ b


def _vjp_matmul(emit, xs, out, g, attrs):
    a, b = xs
    a_eff = transpose_of(emit, a) if attrs.get("transpose_a") else a
    b_eff = transpose_of(emit, b) if attrs.get("transpose_b") else b
    ga = emit("matmul", g, transpose_of(emit, b_eff))
    gb = emit("matmul", transpose_of(emit, a_eff), g)
    if attrs.get("transpose_a"):
        ga = transpose_of(emit, ga)
    if attrs.get("transpose_b"):
        gb = transpose_of(emit, gb)
    return [ga, gb]


register("matmul", 2, _matmul_infer, _matmul_reference, _vjp_matmul,
         "2-D matrix product op(a) @ op(b); op transposes when transpose_a/transpose_b is set.")


# ---------------------------------------------------------------------------- layout


def _transpose_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"transpose: perm {perm} is not a permutation of the axes of {fmt_shape(x.shape)}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _vjp_transpose(emit, xs, out, g, attrs):
    perm = attrs["perm"]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [emit("transpose", g, perm=inverse)]


register("transpose", 1, _transpose_infer,
         lambda a, at, s: np.ascontiguousarray(np.transpose(a[0], at["perm"])), _vjp_transpose,
         "Permute axes by perm.")


def _static_numel(op: str, shape: Shape) -> tuple[int, int]:
    """(number of batch symbols, product of the static dims)."""
    return sum(1 for d in shape if d == BATCH), int(np.prod([d for d in shape if d != BATCH], dtype=np.int64))


def _reshape_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    shape = tuple(attrs["shape"])
    if _static_numel("reshape", shape) != _static_numel("reshape", x.shape):
        raise ShapeError(f"reshape: cannot reshape {fmt_shape(x.shape)} to {fmt_shape(shape)}; element counts differ")
    return TensorType(shape, x.dtype)


register("reshape", 1, _reshape_infer, lambda a, at, s: a[0].reshape(s),
         lambda emit, xs, out, g, at: [emit("reshape", g, shape=xs[0].shape)],
         "Same elements, new shape.")


def _broadcast_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    shape = tuple(attrs["shape"])
    if broadcast_shapes("broadcast_to", x.shape, shape) != shape:
        raise ShapeError(f"broadcast_to: {fmt_shape(x.shape)} does not broadcast to {fmt_shape(shape)}")
    return TensorType(shape, x.dtype)


register("broadcast_to", 1, _broadcast_infer,
         lambda a, at, s: np.ascontiguousarray(np.broadcast_to(a[0], s)),
         lambda emit, xs, out, g, at: [sum_to(emit, g, xs[0].shape)],
         "Numpy broadcast of x to shape.")


def sum_to_axes(src: tuple[int, ...] | Shape, dst: Shape) -> tuple[tuple[int, ...], int]:
    """Axes of ``src`` summed to reach ``dst`` and how many leading ones are dropped."""
    lead = len(src) - len(dst)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(dst) if d == 1 and src[lead + i] != 1
    )
    return axes, lead


def _sum_to_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    shape = tuple(attrs["shape"])
    if len(shape) > len(x.shape) or broadcast_shapes("sum_to", shape, x.shape) != tuple(x.shape):
        raise ShapeError(f"sum_to: {fmt_shape(x.shape)} cannot be reduced to {fmt_shape(shape)}")
    return TensorType(shape, x.dtype)


def _sum_to_reference(args, attrs, shape):
    x = args[0]
    axes, lead = sum_to_axes(x.shape, tuple(attrs["shape"]))
    return np.sum(x, axis=axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)


register("sum_to", 1, _sum_to_infer, _sum_to_reference,
         lambda emit, xs, out, g, at: [emit("broadcast_to", g, shape=xs[0].shape)],
         "Sum x over broadcast axes down to shape (the gradient of a broadcast).")


# ---------------------------------------------------------------------------- reductions


def _reduce_infer(op: str) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (x,) = types
        axes = tuple(attrs["axes"])
        if axes != normalize_axes(op, axes, len(x.shape)):
            raise ShapeError(f"{op}: axes {axes} must be sorted, in range and unique for {fmt_shape(x.shape)}")
        return TensorType(reduced_shape(x.shape, axes, attrs["keepdims"]), x.dtype)

    return infer


def _keep_shape(shape: Shape, axes: tuple[int, ...]) -> Shape:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _vjp_sum(emit, xs, out, g, attrs):
    kept = emit("reshape", g, shape=_keep_shape(xs[0].shape, attrs["axes"]))
    return [emit("broadcast_to", kept, shape=xs[0].shape)]


def _vjp_mean(emit, xs, out, g, attrs):
    kept = emit("reshape", g, shape=_keep_shape(xs[0].shape, attrs["axes"]))
    return [emit("mean_grad", kept, shape=xs[0].shape, axes=attrs["axes"])]


register("sum", 1, _reduce_infer("sum"),
         lambda a, at, s: np.asarray(np.sum(a[0], axis=at["axes"], keepdims=at["keepdims"]), a[0].dtype),
         _vjp_sum, "Sum over axes.")
register("mean", 1, _reduce_infer("mean"),
         lambda a, at, s: np.asarray(np.mean(a[0], axis=at["axes"], keepdims=at["keepdims"]), a[0].dtype),
         _vjp_mean, "Mean over axes (the count is taken at run time, so batch-size independent).")


def _mean_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (g,) = types
    shape = tuple(attrs["shape"])
    if broadcast_shapes("mean_grad", g.shape, shape) != shape:
        raise ShapeError(f"mean_grad: {fmt_shape(g.shape)} does not broadcast to {fmt_shape(shape)}")
    return TensorType(shape, g.dtype)


def _mean_grad_reference(args, attrs, shape):
    count = int(np.prod([shape[a] for a in attrs["axes"]], dtype=np.int64))
    return np.ascontiguousarray(np.broadcast_to(args[0] / np.asarray(count, args[0].dtype), shape))


register("mean_grad", 1, _mean_grad_infer, _mean_grad_reference, None,
         "Backward of mean: broadcast grad to shape, divided by the count of the reduced axes.")


# ---------------------------------------------------------------------------- loss


def _mse_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    p, y = types
    same_dtype("mse", types)
    if p.shape != y.shape:
        raise ShapeError(
            f"mse: prediction shape {fmt_shape(p.shape)} differs from target shape {fmt_shape(y.shape)}; "
            "expected equal shapes"
        )
    return TensorType((), p.dtype)


def _mse_reference(args, attrs, shape):
    d = args[0] - args[1]
    return np.asarray(np.mean(d * d), args[0].dtype)


def _vjp_mse(emit, xs, out, g, attrs):
    gp = emit("mse_grad", xs[0], xs[1], g)
    return [gp, emit("neg", gp)]


def _mse_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    p, y, g = types
    _mse_infer([p, y], attrs)
    same_dtype("mse_grad", types)
    if g.shape != ():
        raise ShapeError(f"mse_grad: upstream gradient must be a scalar, got {fmt_shape(g.shape)}")
    return TensorType(p.shape, p.dtype)


def _mse_grad_reference(args, attrs, shape):
    p, y, g = args
    scale = (2.0 * g / max(p.size, 1)).astype(p.dtype)
    return (p - y) * scale


register("mse", 2, _mse_infer, _mse_reference, _vjp_mse,
         "Mean squared error mean((p - y)^2) over all elements; a scalar.")
register("mse_grad", 3, _mse_grad_infer, _mse_grad_reference, None,
         "Backward of mse wrt p: 2 * (p - y) * grad / numel(p). Operands: (p, y, grad).")


# ---------------------------------------------------------------------------- fused ops
# Produced only by the e-graph optimizer (no VJP): each one is a single kernel that a
# chain of the ops above would run as several, with round trips through memory.


def _fused_matmul_type(op: str, a: TensorType, b: TensorType, attrs: dict[str, Any]) -> TensorType:
    try:
        return _matmul_infer([a, b], attrs)
    except ShapeError as e:
        raise ShapeError(str(e).replace("matmul:", f"{op}:", 1)) from None


def _linear_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, w, b = types
    same_dtype("linear", types)
    out = _fused_matmul_type("linear", x, w, attrs)
    if b.shape != (out.shape[1],):
        raise ShapeError(
            f"linear: bias has shape {fmt_shape(b.shape)}, expected ({out.shape[1]},) for output {fmt_shape(out.shape)}"
        )
    if attrs.get("activation", "none") not in ("none", "relu"):
        raise ValueError(f"linear: unknown activation {attrs['activation']!r}; expected 'none' or 'relu'")
    return out


def _linear_reference(args, attrs, shape):
    out = _matmul_reference(args[:2], attrs, shape) + args[2]
    return np.maximum(out, 0) if attrs.get("activation") == "relu" else out


register("linear", 3, _linear_infer, _linear_reference, None,
         "act(op(x) @ op(w) + b) with b broadcast over rows; act is 'none' or 'relu'.")


def _product_shaped_third(op: str, role: str) -> Infer:
    """Shape rule of a fused product whose third operand has the product's shape."""

    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        a, b, third = types
        same_dtype(op, types)
        out = _fused_matmul_type(op, a, b, attrs)
        if third.shape != out.shape:
            raise ShapeError(f"{op}: {role} has shape {fmt_shape(third.shape)}, expected {fmt_shape(out.shape)}")
        return out

    return infer


def _gemm_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    out = _product_shaped_third("gemm", "accumulator")(types[:3], attrs)
    same_dtype("gemm", types)
    for role, scale in zip(("alpha", "beta"), types[3:]):
        if scale.shape != ():
            raise ShapeError(f"gemm: {role} has shape {fmt_shape(scale.shape)}, expected a scalar ()")
    return out


def _gemm_reference(args, attrs, shape):
    a, b, c, alpha, beta = args
    product = alpha * _matmul_reference([a, b], attrs, shape)
    return beta * c - product if attrs.get("subtract") else beta * c + product


register("gemm", 5, _gemm_infer, _gemm_reference, None,
         "BLAS-style gemm beta * c + alpha * op(a) @ op(b) (minus the product when subtract) with 0-d "
         "alpha and beta, constants or run-time scalars (e.g. an SGD update folded into the weight gradient).")


register("matmul_relu_grad", 3, _product_shaped_third("matmul_relu_grad", "mask source"),
         lambda a, at, s: np.where(a[2] > 0, _matmul_reference(a[:2], at, s), np.zeros((), a[2].dtype)), None,
         "relu_grad(z, op(a) @ op(b)): a backward product with the ReLU mask as its epilogue.")


# ---------------------------------------------------------------------------- dtype and structure


def _cast_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return TensorType(types[0].shape, dtype_name(attrs["dtype"]))


register("cast", 1, _cast_infer, lambda a, at, s: a[0].astype(at["dtype"]),
         lambda emit, xs, out, g, at: [emit("cast", g, dtype=xs[0].dtype)],
         "x converted to dtype (float32 <-> float64); how mixed-dtype operands are promoted.")


def _stack_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    if not types:
        raise ShapeError("stack: needs at least one tensor")
    dtype = same_dtype("stack", types)
    first = types[0].shape
    for t in types[1:]:
        if t.shape != first:
            raise ShapeError(f"stack: shapes {fmt_shape(first)} and {fmt_shape(t.shape)} differ; expected equal shapes")
    return TensorType((len(types),) + tuple(first), dtype)


def _index_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    if not x.shape or x.shape[0] == BATCH or not 0 <= attrs["index"] < x.shape[0]:
        raise ShapeError(f"index: {attrs['index']} is out of range for the first axis of {fmt_shape(x.shape)}")
    return TensorType(tuple(x.shape[1:]), x.dtype)


register("stack", None, _stack_infer, lambda a, at, s: np.stack(a),
         lambda emit, xs, out, g, at: [emit("index", g, index=i) for i in range(len(xs))],
         "Tensors of one shape stacked along a new first axis.")
register("index", 1, _index_infer, lambda a, at, s: np.array(a[0][at["index"]]), None,
         "x[index] along the first axis (the gradient of stack).")


# ---------------------------------------------------------------------------- classification


def _vjp_max(emit, xs, out, g, attrs):
    # PyTorch's amax: the gradient is shared evenly between tied maxima.
    x, axes = xs[0], attrs["axes"]
    kept = _keep_shape(x.shape, axes)
    mask = emit("eq", x, emit("reshape", out, shape=kept))
    ties = emit("sum", mask, axes=axes, keepdims=True)
    return [emit("mul", mask, emit("div", emit("reshape", g, shape=kept), ties))]


register("eq", 2, _binary_infer("eq"), lambda a, at, s: (a[0] == a[1]).astype(a[0].dtype),
         lambda emit, xs, out, g, at: [None, None], "1.0 where x == y, else 0.0 (numpy broadcasting).")
register("max", 1, _reduce_infer("max"),
         lambda a, at, s: np.asarray(np.max(a[0], axis=at["axes"], keepdims=at["keepdims"]), a[0].dtype),
         _vjp_max, "Maximum over axes.")


def _axis_infer(op: str, operands: int) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        result = _same_shape_infer(op)(types, attrs) if operands > 1 else types[0]
        if not 0 <= attrs["axis"] < len(result.shape):
            raise ShapeError(f"{op}: axis {attrs['axis']} is out of range for {fmt_shape(result.shape)}")
        return result

    return infer


def _log_softmax_reference(args, attrs, shape):
    x, axis = args[0], attrs["axis"]
    with np.errstate(over="ignore"):  # x - max may overflow to -inf: clamped to the lowest finite value
        shifted = x - np.max(x, axis=axis, keepdims=True)
        result = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return np.maximum(result, np.finfo(result.dtype).min)


def _log_softmax_grad_reference(args, attrs, shape):
    y, g = args
    return g - np.exp(y) * np.sum(g, axis=attrs["axis"], keepdims=True)


register("log_softmax", 1, _axis_infer("log_softmax", 1), _log_softmax_reference,
         lambda emit, xs, out, g, at: [emit("log_softmax_grad", out, g, axis=at["axis"])],
         "x - max - log(sum(exp(x - max))) along axis, at least the dtype's lowest finite value: finite for "
         "any finite x.")
register("log_softmax_grad", 2, _axis_infer("log_softmax_grad", 2), _log_softmax_grad_reference, None,
         "Backward of log_softmax from its output y: g - exp(y) * sum(g, axis). Operands: (y, grad).")


def above_diagonal(shape: Shape) -> np.ndarray:
    """True strictly above the diagonal of the last two axes (column > row), broadcast to ``shape``."""
    rows, cols = shape[-2], shape[-1]
    return np.broadcast_to(np.triu(np.ones((rows, cols), bool), 1), shape)


def _softmax_infer(op: str, operands: int) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        result = _axis_infer(op, operands)(types, attrs)
        if attrs.get("causal", False) and (len(result.shape) < 2 or attrs["axis"] != len(result.shape) - 1
                                           or BATCH in result.shape[-2:]):
            raise ShapeError(f"{op}: causal runs along the last axis of static (rows, columns), "
                             f"got axis {attrs['axis']} of {fmt_shape(result.shape)}")
        return result

    return infer


def _softmax_reference(args, attrs, shape):
    x, axis = args[0], attrs["axis"]
    if attrs.get("causal", False):
        x = np.where(above_diagonal(x.shape), -np.inf, x)
    with np.errstate(invalid="ignore"):  # a row of -inf only is NaN, as PyTorch's
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax_grad_reference(args, attrs, shape):
    y, g = args
    if not attrs.get("causal", False):
        return y * (g - np.sum(y * g, axis=attrs["axis"], keepdims=True))
    above = above_diagonal(g.shape)
    g = np.where(above, 0.0, g).astype(g.dtype)
    return np.where(above, 0.0, y * (g - np.sum(y * g, axis=attrs["axis"], keepdims=True))).astype(g.dtype)


def _vjp_softmax(emit, xs, out, g, attrs):
    causal = {"causal": True} if attrs.get("causal", False) else {}
    return [emit("softmax_grad", out, g, axis=attrs["axis"], **causal)]


register("softmax", 1, _softmax_infer("softmax", 1), _softmax_reference, _vjp_softmax,
         "exp(x - max) / sum(exp(x - max)) along axis, one kernel: no log-probabilities in between, and a "
         "gradient read from the probabilities alone. ``causal``: x is -inf strictly above the diagonal of "
         "the last two axes (column > row: attention's causal mask, axis the last), so zeros there.")
register("softmax_grad", 2, _softmax_infer("softmax_grad", 2), _softmax_grad_reference, None,
         "Backward of softmax from its output y: y * (g - sum(y * g, axis)). Operands: (y, grad). ``causal``: "
         "g is read as zero strictly above the diagonal (zeros there).")


def _last_axis_infer(op: str, operands: int) -> Infer:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        result = _same_shape_infer(op)(types, attrs) if operands > 1 else types[0]
        if not result.shape:
            raise ShapeError(f"{op}: expected a tensor of at least 1 dimension, got a scalar")
        if not attrs["eps"] >= 0.0:
            raise ValueError(f"{op}: eps must be a non-negative number, got {attrs['eps']!r}")
        return result

    return infer


def _row_statistics(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """x - mean and 1 / sqrt(var + eps) over the last axis (biased variance)."""
    centered = x - np.mean(x, axis=-1, keepdims=True)
    variance = np.mean(centered * centered, axis=-1, keepdims=True)
    return centered, (1.0 / np.sqrt(variance + np.asarray(eps, x.dtype))).astype(x.dtype)


def _layer_norm_reference(args, attrs, shape):
    centered, rstd = _row_statistics(args[0], attrs["eps"])
    return centered * rstd


def _layer_norm_grad_reference(args, attrs, shape):
    x, g = args
    centered, rstd = _row_statistics(x, attrs["eps"])
    normalized = centered * rstd
    mean_g = np.mean(g, axis=-1, keepdims=True)
    mean_gx = np.mean(g * normalized, axis=-1, keepdims=True)
    return rstd * (g - mean_g - normalized * mean_gx)


register("layer_norm", 1, _last_axis_infer("layer_norm", 1), _layer_norm_reference,
         lambda emit, xs, out, g, at: [emit("layer_norm_grad", xs[0], g, eps=at["eps"])],
         "(x - mean) / sqrt(var + eps) over the last axis (biased variance): LayerNorm before its scale and "
         "shift, as one kernel.")
register("layer_norm_grad", 2, _last_axis_infer("layer_norm_grad", 2), _layer_norm_grad_reference, None,
         "Backward of layer_norm from its input x (statistics recomputed) and the gradient g of the normalized "
         "x^ = (x - mean) * r: r * (g - mean(g) - x^ * mean(g * x^)), means over the last axis. Operands: (x, g).")


def _one_hot_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (labels,) = types
    if len(labels.shape) != 1:
        raise ShapeError(f"one_hot: labels must have shape (batch,), got {fmt_shape(labels.shape)}")
    if attrs["classes"] < 1:
        raise ValueError(f"one_hot: classes must be positive, got {attrs['classes']}")
    return TensorType((labels.shape[0], attrs["classes"]), labels.dtype)


def check_labels(labels: np.ndarray, classes: int) -> None:
    """ValueError unless every label is an integer in [0, classes) (what ``one_hot`` takes)."""
    with np.errstate(invalid="ignore"):
        bad = ~((labels == np.floor(labels)) & (labels >= 0) & (labels < classes))
    if np.any(bad):
        raise ValueError(f"one_hot: labels must be integers in [0, {classes}), got {labels[bad][:5].tolist()}")


def _one_hot_reference(args, attrs, shape):
    labels, classes = args[0], attrs["classes"]
    check_labels(labels, classes)
    return (labels[:, None] == np.arange(classes)).astype(labels.dtype)


register("one_hot", 1, _one_hot_infer, _one_hot_reference, lambda emit, xs, out, g, at: [None],
         "Integer class labels (N,) as rows of an (N, classes) identity.")


def _xent_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    y, p = types
    result = _same_shape_infer("softmax_xent_grad")(types, attrs)
    if len(y.shape) != 2:
        raise ShapeError(f"softmax_xent_grad: log-probabilities must be (batch, classes), got {fmt_shape(y.shape)}")
    return result


def _xent_grad_reference(args, attrs, shape):
    y, p = args
    scale = np.asarray(attrs["scale"] / y.shape[0], y.dtype)
    return (np.exp(y) * np.sum(p, axis=1, keepdims=True) - p) * scale


register("softmax_xent_grad", 2, _xent_grad_infer, _xent_grad_reference, None,
         "Fused gradient of mean cross-entropy wrt the logits, from y = log_softmax(z) (N, C) and targets p: "
         "scale * (softmax(z) * sum(p, 1) - p) / N; (softmax(z) - onehot) / N for labels.")


# ---------------------------------------------------------------------------- collectives
# Opaque to the e-graph (no rule sees through them), so the update is never folded into
# the gradient's GEMM across the reduction; codegen never sees them either: a step that
# holds one is split there and the reduction runs between the compiled halves
# (mlir_nn.distributed.split).


# What a collective does belongs to the layer that talks to the other ranks: it hands the
# registry its reference here (mlir_nn.distributed.comm does, when it is imported).
COLLECTIVE_REFERENCES: dict[str, Callable[[np.ndarray], np.ndarray]] = {}


def _allreduce_mean_reference(args, attrs, shape):
    try:
        reduce = COLLECTIVE_REFERENCES["allreduce_mean"]
    except KeyError:
        raise RuntimeError("allreduce_mean: no reference is registered (import mlir_nn.distributed)") from None
    return reduce(args[0])


register("allreduce_mean", 1, _unary_infer, _allreduce_mean_reference, None,
         "Mean of x over all ranks, each weighted by its sample weight (default 1); x itself outside MPI.")


# ---------------------------------------------------------------------------- nn layers (issue 21a)
# erf (GELU), numel (BatchNorm's unbiased variance over a run-time batch) and dropout
# (Philox-4x32-10 masks, mlir_nn.ir.philox).


def _vjp_erf(emit, xs, out, g, attrs):
    x = xs[0]
    slope = emit("exp", emit("neg", emit("mul", x, x)))
    return [emit("mul", g, emit("mul", 2.0 / math.sqrt(math.pi), slope))]


register("erf", 1, _unary_infer, lambda a, at, s: _erf(a[0]), _vjp_erf,
         "The error function erf(x) = 2/sqrt(pi) * integral of exp(-t^2) from 0 to x.")


def _erf(x: np.ndarray) -> np.ndarray:
    """libm's erf per element (what the compiled code calls), in x's dtype."""
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)  # a 0-d x gives a Python float


def _numel_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    normalize_axes("numel", tuple(attrs["axes"]), len(x.shape))
    return TensorType((), x.dtype)


def _numel_reference(args, attrs, shape):
    return np.array(float(np.prod([args[0].shape[a] for a in attrs["axes"]], dtype=np.int64)), dtype=args[0].dtype)


register("numel", 1, _numel_infer, _numel_reference, lambda emit, xs, out, g, at: [None],
         "The number of elements of x along axes (run-time batch included), a 0-d tensor of x's dtype; its users "
         "divide by it less one (an unbiased variance), so a step holding one over the batch needs two rows.")


def _dropout_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    dtype = same_dtype("dropout", types)
    expected = 1 + philox.KEY_CHUNKS + philox.OFFSET_CHUNKS
    if len(types) != expected or any(t.shape != () for t in types[1:]):
        raise ShapeError(f"dropout: expected x and {expected - 1} 0-d key and offset chunks, got "
                         f"{', '.join(fmt_shape(t.shape) for t in types)}")
    p = attrs["p"]
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    return TensorType(types[0].shape, dtype)


def dropout_scale(p: float, dtype: str) -> np.ndarray:
    """1 / (1 - p) in ``dtype`` (what kept elements are multiplied by); 0 when p == 1."""
    return np.array(0.0 if p == 1.0 else 1.0 / (1.0 - p), dtype=dtype)


def _dropout_reference(args, attrs, shape):
    x, chunks = args[0], args[1:]
    key = philox.from_chunks(list(chunks[:philox.KEY_CHUNKS]))
    offset = philox.from_chunks(list(chunks[philox.KEY_CHUNKS:])) + int(attrs["slot"])
    keep = philox.keep_mask(x.shape, key, offset, float(attrs["p"]))
    return np.where(keep, x * dropout_scale(float(attrs["p"]), x.dtype.name), np.zeros((), x.dtype))


def _vjp_dropout(emit, xs, out, g, attrs):
    """Linear in x with the same mask: the gradient is dropout of g with the same key, offset and slot."""
    return [emit("dropout", g, *xs[1:], **attrs)] + [None] * (len(xs) - 1)


register("dropout", 1 + philox.KEY_CHUNKS + philox.OFFSET_CHUNKS, _dropout_infer, _dropout_reference, _vjp_dropout,
         "x * mask / (1 - p): the mask keeps element i (row-major) when word 0 of Philox-4x32-10 at counter "
         "(i, offset + slot) under the key is >= ceil(p * 2^32). Operands: x, 4 key chunks, 3 offset chunks "
         "(16 bits each, 0-d); attributes p and slot.")


# ---------------------------------------------------------------------------- issue 21b: losses and masks
# abs/sign (the comparisons are mlir_nn.ir.sequence_ops'), elementwise maximum/minimum (clamp) and a
# stable softplus: what the losses of ``mlir_nn.losses`` are written with.


register("sign", 1, _unary_infer, lambda a, at, s: np.sign(a[0]), lambda emit, xs, out, g, at: [None],
         "-1, 0 or 1 by the sign of x (no gradient).")
register("abs", 1, _unary_infer, lambda a, at, s: np.abs(a[0]),
         lambda emit, xs, out, g, at: [emit("mul", g, emit("sign", xs[0]))],
         "|x|; its gradient is sign(x) (0 at 0, as PyTorch).")


def _extremum_vjp(winner: str) -> Vjp:
    """PyTorch's maximum/minimum gradient: the winner takes it, ties share it evenly."""
    def vjp(emit, xs, out, g, attrs):
        a, b = xs
        share_a = emit("add", emit(winner, a, b), emit("mul", 0.5, emit("eq", a, b)))
        share_b = emit("sub", 1.0, share_a)
        return [sum_to(emit, emit("mul", g, share_a), a.shape), sum_to(emit, emit("mul", g, share_b), b.shape)]

    return vjp


register("maximum", 2, _binary_infer("maximum"), lambda a, at, s: np.maximum(a[0], a[1]), _extremum_vjp("gt"),
         "Elementwise max(x, y) with numpy broadcasting; ties share the gradient evenly.")
register("minimum", 2, _binary_infer("minimum"), lambda a, at, s: np.minimum(a[0], a[1]), _extremum_vjp("lt"),
         "Elementwise min(x, y) with numpy broadcasting; ties share the gradient evenly.")
register("softplus", 1, _unary_infer, lambda a, at, s: np.logaddexp(np.zeros((), a[0].dtype), a[0]),
         lambda emit, xs, out, g, at: [emit("mul", g, emit("sigmoid", xs[0]))],
         "log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)): finite for any finite x.")
