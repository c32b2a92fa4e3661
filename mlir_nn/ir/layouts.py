"""The image layout of the window ops: NCHW (PyTorch's, the default) or NHWC.

A window op with ``layout="NHWC"`` reads and writes its image operands and result as (N, H, W, C)
tensors; weights, biases, the pooling index's values (row-major h * W + w) and attributes stay as
they are. Traced steps hold NCHW ops only: the optimizer's layout rules make the NHWC forms where
the transposes around them cancel. ``in_layouts`` gives an NCHW op's shape rule, reference and
VJP their NHWC forms: the NCHW op between transposes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mlir_nn.ir.ops import Infer, Reference, TensorType, Vjp
from mlir_nn.ir.shapes import BATCH, Shape, ShapeError, fmt_shape

NCHW, NHWC = "NCHW", "NHWC"
LAYOUTS = (NCHW, NHWC)
TO_NHWC = (0, 2, 3, 1)  # the perm of the transpose NCHW -> NHWC
TO_NCHW = (0, 3, 1, 2)  # and back


def layout_of(op: str, attrs: dict[str, Any]) -> str:
    """The layout ``attrs`` name (NCHW when absent), checked."""
    layout = attrs.get("layout", NCHW)
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    return layout


def nchw_shape(shape: Shape, layout: str) -> Shape:
    """An image shape of ``layout`` as the NCHW shape of the same image."""
    return tuple(shape) if layout == NCHW else tuple(shape[i] for i in TO_NCHW)


def layout_shape(shape: Shape, layout: str) -> Shape:
    """An NCHW image shape as the shape of the same image in ``layout``."""
    return tuple(shape) if layout == NCHW else tuple(shape[i] for i in TO_NHWC)


def without_layout(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` less the layout: the NCHW op's attributes."""
    return {k: v for k, v in attrs.items() if k != "layout"}


def in_layouts(op: str, images: Sequence[int], image_out: bool, infer: Infer, reference: Reference,
               vjp: Vjp | None) -> tuple[Infer, Reference, Vjp | None]:
    """The shape rule, reference and VJP of ``op`` (written for NCHW; ``images``: the operands that
    are images, ``image_out``: whether the result is one) in either layout."""

    def infer_any(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        layout = layout_of(op, attrs)
        if layout == NCHW:
            return infer(types, without_layout(attrs))
        for i in images:
            if len(types[i].shape) != 4 or BATCH in types[i].shape[1:]:
                raise ShapeError(f"{op}: operand {i} must be NHWC (batch, height, width, channels), "
                                 f"got {fmt_shape(types[i].shape)}")
        nchw = [TensorType(nchw_shape(t.shape, NHWC), t.dtype) if i in images else t for i, t in enumerate(types)]
        result = infer(nchw, without_layout(attrs))
        return TensorType(layout_shape(result.shape, NHWC), result.dtype) if image_out else result

    def reference_any(args: list[np.ndarray], attrs: dict[str, Any], state: Any) -> np.ndarray:
        if layout_of(op, attrs) == NCHW:
            return reference(args, without_layout(attrs), state)
        nchw = [np.transpose(a, TO_NCHW) if i in images else a for i, a in enumerate(args)]
        result = reference(nchw, without_layout(attrs), state)
        return np.ascontiguousarray(np.transpose(result, TO_NHWC)) if image_out else result

    def vjp_any(emit: Callable[..., Any], xs: list, out: Any, g: Any, attrs: dict[str, Any]) -> list:
        assert vjp is not None
        if layout_of(op, attrs) == NCHW:
            return vjp(emit, xs, out, g, without_layout(attrs))

        def nchw(v: Any) -> Any:
            return emit("transpose", v, perm=TO_NCHW)

        grads = vjp(emit, [nchw(v) if i in images else v for i, v in enumerate(xs)],
                    nchw(out) if image_out else out, nchw(g) if image_out else g, without_layout(attrs))
        return [emit("transpose", d, perm=TO_NHWC) if i in images and d is not None else d
                for i, d in enumerate(grads)]

    return infer_any, reference_any, None if vjp is None else vjp_any
