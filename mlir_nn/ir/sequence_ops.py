"""Ops of sequence models: static slices, gathers by index tensors, selection, comparisons
and batched products (registered into the same registry as ``mlir_nn.ir.ops``).

Index tensors are float tensors of the step's dtype holding integers (as ``one_hot``'s
labels): a compiled step computes in one dtype. The references reject indices that are not
integers in range, naming the op; compiled code reads a gathered operand only through
``index == position`` selections, so an index it was never checked for (one computed in the
step) can never make it read outside a buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.ir.ops import TensorType, register, same_dtype, sum_to
from mlir_nn.ir.shapes import BATCH, Shape, ShapeError, broadcast_shapes, fmt_shape


def check_indices(op: str, index: np.ndarray, size: int) -> np.ndarray:
    """``index`` as int64 when every element is an integer in [-size, size), else ValueError."""
    bad = (index != np.round(index)) | (index < -size) | (index >= size)
    if np.any(bad):
        raise ValueError(f"{op}: indices must be integers in [{-size}, {size}) for an axis of size {size}, "
                         f"got {index[bad][:5].tolist()}")
    return np.where(index < 0, index + size, index).astype(np.int64)


# ---------------------------------------------------------------------------- static slices


def slice_extent(start: int, step: int, size: int, dim: int | str) -> None:
    """Raise unless ``size`` elements from ``start`` by ``step`` lie inside an axis of ``dim``."""
    if dim == BATCH:
        if (start, step, size) != (0, 1, BATCH):
            raise ShapeError("slice: the batch dimension of a traced step can only be taken whole (:)")
        return
    if step < 1:
        raise ShapeError(f"slice: step must be positive (as PyTorch's), got {step}")
    last = start + step * (int(size) - 1)
    if size == BATCH or int(size) < 1 or not (0 <= start < int(dim) and 0 <= last < int(dim)):
        raise ShapeError(f"slice: {size} elements from {start} by step {step} do not fit an axis of size {dim}")


def _slice_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    start, step, shape = attrs["start"], attrs["step"], tuple(attrs["shape"])
    if not len(start) == len(step) == len(shape) == len(x.shape):
        raise ShapeError(f"slice: start {start}, step {step} and shape {shape} must each have one entry per axis "
                         f"of {fmt_shape(x.shape)}")
    for b, s, n, d in zip(start, step, shape, x.shape):
        slice_extent(b, s, n, d)
    return TensorType(shape, x.dtype)


def _slices(attrs: dict[str, Any], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(b, b + s * n, s) for b, s, n in zip(attrs["start"], attrs["step"], shape))


def _slice_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (g,) = types
    full = tuple(attrs["shape"])
    _slice_infer([TensorType(full, g.dtype)], {**attrs, "shape": g.shape})
    return TensorType(full, g.dtype)


def _slice_grad_reference(args, attrs, shape):
    out = np.zeros(shape, args[0].dtype)
    out[_slices(attrs, args[0].shape)] = args[0]
    return out


register("slice", 1, _slice_infer, lambda a, at, s: np.ascontiguousarray(a[0][_slices(at, s)]),
         lambda emit, xs, out, g, at: [emit("slice_grad", g, start=at["start"], step=at["step"],
                                            shape=xs[0].shape)],
         "x[start + step * i] on every axis: a static strided box of shape `shape`.")
register("slice_grad", 1, _slice_grad_infer, _slice_grad_reference,
         lambda emit, xs, out, g, at: [emit("slice", g, start=at["start"], step=at["step"], shape=xs[0].shape)],
         "Zeros of `shape` with x placed at the strided box (start, step): the gradient of slice; a sum of "
         "them is a concatenation.")


# ---------------------------------------------------------------------------- gathers


def _static_axis(op: str, x: TensorType, axis: int) -> int:
    if not 0 <= axis < len(x.shape):
        raise ShapeError(f"{op}: axis {axis} is out of range for {fmt_shape(x.shape)}")
    if x.shape[axis] == BATCH:
        raise ShapeError(f"{op}: cannot index along the batch dimension of {fmt_shape(x.shape)}")
    return int(x.shape[axis])


def _take_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, index = types
    same_dtype("take", types)
    axis = attrs["axis"]
    _static_axis("take", x, axis)
    return TensorType(tuple(x.shape[:axis]) + tuple(index.shape) + tuple(x.shape[axis + 1:]), x.dtype)


def _take_reference(args, attrs, shape):
    x, index = args
    return np.take(x, check_indices("take", index, x.shape[attrs["axis"]]), axis=attrs["axis"])


def _take_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    g, index = types
    same_dtype("take_grad", types)
    axis, rank = attrs["axis"], len(index.shape)
    if tuple(g.shape[axis:axis + rank]) != tuple(index.shape):
        raise ShapeError(f"take_grad: gradient {fmt_shape(g.shape)} does not hold index {fmt_shape(index.shape)} "
                         f"at axis {axis}")
    return TensorType(tuple(g.shape[:axis]) + (attrs["size"],) + tuple(g.shape[axis + rank:]), g.dtype)


def _take_grad_reference(args, attrs, shape):
    g, index = args
    axis = attrs["axis"]
    flat = check_indices("take_grad", index, attrs["size"]).reshape(-1)
    moved = np.moveaxis(np.zeros(shape, g.dtype), axis, 0)
    rows = g.reshape(g.shape[:axis] + (flat.size,) + g.shape[axis + index.ndim:])
    np.add.at(moved, flat, np.moveaxis(rows, axis, 0))  # repeated indices add up
    return np.ascontiguousarray(np.moveaxis(moved, 0, axis))


register("take", 2, _take_infer, _take_reference,
         lambda emit, xs, out, g, at: [emit("take_grad", g, xs[1], axis=at["axis"], size=xs[0].shape[at["axis"]]),
                                       None],
         "x indexed along `axis` by an index tensor (numpy's take, torch's index_select and x[idx]). "
         "Operands: (x, index).")
register("take_grad", 2, _take_grad_infer, _take_grad_reference, None,
         "Scatter-add of g into zeros with `size` rows along `axis` at the index tensor's positions (repeated "
         "indices add up): the gradient of take. Operands: (g, index).")


def _gather_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, index = types
    same_dtype("gather", types)
    axis = attrs["axis"]
    _static_axis("gather", x, axis)
    if len(index.shape) != len(x.shape) or any(i != d for k, (i, d) in enumerate(zip(index.shape, x.shape))
                                                if k != axis):
        raise ShapeError(f"gather: index {fmt_shape(index.shape)} must match input {fmt_shape(x.shape)} on every "
                         f"axis but {axis}")
    return TensorType(tuple(index.shape), x.dtype)


def _gather_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    g, index = types
    dtype = same_dtype("gather_grad", types)
    if tuple(g.shape) != tuple(index.shape):
        raise ShapeError(f"gather_grad: gradient {fmt_shape(g.shape)} and index {fmt_shape(index.shape)} differ")
    axis = attrs["axis"]
    return TensorType(tuple(g.shape[:axis]) + (attrs["size"],) + tuple(g.shape[axis + 1:]), dtype)


def _gather_grad_reference(args, attrs, shape):
    g, index = args
    axis = attrs["axis"]
    out = np.zeros(shape, g.dtype)
    where = list(np.indices(index.shape, sparse=True))
    where[axis] = check_indices("gather_grad", index, attrs["size"])
    np.add.at(out, tuple(where), g)
    return out


register("gather", 2, _gather_infer,
         lambda a, at, s: np.take_along_axis(a[0], check_indices("gather", a[1], a[0].shape[at["axis"]]),
                                             axis=at["axis"]),
         lambda emit, xs, out, g, at: [emit("gather_grad", g, xs[1], axis=at["axis"],
                                            size=xs[0].shape[at["axis"]]), None],
         "torch.gather: out[..., i, ...] = x[..., index[..., i, ...], ...] along `axis`. Operands: (x, index).")
register("gather_grad", 2, _gather_grad_infer, _gather_grad_reference, None,
         "Scatter-add of g along `axis` into zeros of `size` there (torch's scatter_add): the gradient of gather. "
         "Operands: (g, index).")


# ---------------------------------------------------------------------------- selection and comparisons


def _where_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    same_dtype("where", types)
    shape: Shape = types[0].shape
    for t in types[1:]:
        shape = broadcast_shapes("where", shape, t.shape)
    return TensorType(shape, types[1].dtype)


def _vjp_where(emit, xs, out, g, attrs):
    cond, a, b = xs
    return [None, sum_to(emit, emit("where", cond, g, 0.0), a.shape), sum_to(emit, emit("where", cond, 0.0, g),
                                                                             b.shape)]


register("where", 3, _where_infer,
         lambda a, at, s: np.ascontiguousarray(np.broadcast_to(np.where(a[0] != 0, a[1], a[2]), s)), _vjp_where,
         "a where cond is nonzero, else b (numpy broadcasting). Operands: (cond, a, b).")


def _compare_infer(op: str):
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        dtype = same_dtype(op, types)
        return TensorType(broadcast_shapes(op, types[0].shape, types[1].shape), dtype)

    return infer


COMPARISONS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "ne": np.not_equal}
for _name, _fn in COMPARISONS.items():
    register(_name, 2, _compare_infer(_name),
             lambda a, at, s, fn=_fn: fn(a[0], a[1]).astype(a[0].dtype),
             lambda emit, xs, out, g, at: [None, None],
             f"1.0 where numpy.{_fn.__name__}(x, y), else 0.0 (numpy broadcasting).")


# ---------------------------------------------------------------------------- batched products


def _bmm_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    a, b = types
    dtype = same_dtype("bmm", types)
    if len(a.shape) < 3 or len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"bmm: expected (..., m, k) @ (..., k, n) with equal batch dimensions, got "
                         f"{fmt_shape(a.shape)} @ {fmt_shape(b.shape)}")
    if BATCH in (a.shape[-1], a.shape[-2], b.shape[-1]):
        raise ShapeError(f"bmm: the batch dimension cannot be a matrix axis: {fmt_shape(a.shape)} @ "
                         f"{fmt_shape(b.shape)}")
    return TensorType(tuple(a.shape[:-1]) + (b.shape[-1],), dtype)


def swap_last(emit, x):
    """x with its last two axes swapped."""
    rank = len(x.shape)
    return emit("transpose", x, perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))


def _vjp_bmm(emit, xs, out, g, attrs):
    a, b = xs
    return [emit("bmm", g, swap_last(emit, b)), emit("bmm", swap_last(emit, a), g)]


register("bmm", 2, _bmm_infer, lambda a, at, s: np.matmul(a[0], a[1]), _vjp_bmm,
         "Batched matrix product (..., m, k) @ (..., k, n) over equal leading batch dimensions.")
