"""Shapes, dtypes and the errors raised when they do not fit.

A dimension is either a concrete ``int`` or the symbol ``"N"``: the batch dimension of a
traced step, bound to a size only when the step runs. One compiled step therefore serves
every batch size, the short last mini-batch included.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

Dim = int | str
Shape = tuple[Dim, ...]

BATCH = "N"
DTYPES = ("float32", "float64")


class ShapeError(ValueError):
    """An operation got operands whose shapes do not fit together."""


class DTypeError(TypeError):
    """An operation got operands of different or unsupported dtypes."""


def fmt_shape(shape: Shape) -> str:
    """``(N, 32)`` style text for error messages and the printer."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def broadcast_shapes(op: str, a: Shape, b: Shape) -> Shape:
    """Numpy broadcasting of two shapes; the symbolic batch dim only matches itself or 1."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise ShapeError(
                f"{op}: shapes {fmt_shape(a)} and {fmt_shape(b)} do not broadcast "
                f"(dimension {-i}: {da} vs {db}; expected equal sizes or 1)"
            )
    return tuple(reversed(out))


def reduced_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    """Shape after reducing ``axes`` (already normalized to non-negative ints)."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def normalize_axes(op: str, axes: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    """Turn ``None``/negative/int axes into a sorted tuple of non-negative ints."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ShapeError(f"{op}: axis {ax} is out of range for a tensor of rank {ndim}")
        out.append(ax % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {tuple(axes)}")
    return tuple(sorted(out))


def resolve(shape: Shape, batch: int | None) -> tuple[int, ...]:
    """Concrete shape with the batch symbol replaced by ``batch``."""
    if batch is None:
        if BATCH in shape:
            raise ShapeError(f"shape {fmt_shape(shape)} has the batch dimension but no batch size is bound")
        return tuple(int(d) for d in shape)  # type: ignore[arg-type]
    return tuple(batch if d == BATCH else int(d) for d in shape)


def numel(shape: Shape, batch_estimate: int = 1) -> int:
    """Element count, counting the batch symbol as ``batch_estimate``."""
    return math.prod(batch_estimate if d == BATCH else int(d) for d in shape)


def numpy_name(dtype: np.dtype | str | type) -> str:
    """NumPy's name of ``dtype`` (looked up once per dtype: NumPy works it out on every call, 2 us,
    and tracing a deep MLP's Adam step asked ~3000 times)."""
    try:
        return _numpy_name(dtype)
    except TypeError:  # (unhashable: NumPy says what it makes of it)
        return np.dtype(dtype).name


@cache
def _numpy_name(dtype: np.dtype | str | type) -> str:
    return np.dtype(dtype).name


def dtype_name(dtype: np.dtype | str) -> str:
    """Canonical dtype name; only float32 and float64 tensors exist."""
    name = numpy_name(dtype)
    if name not in DTYPES:
        raise DTypeError(f"unsupported dtype {name}; expected one of {', '.join(DTYPES)}")
    return name
