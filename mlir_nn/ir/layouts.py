"""The image layout of the convolution-family ops: NCHW (PyTorch's, the default) or NHWC.

A window op with ``layout="NHWC"`` reads and writes its image operands and results as (N, H, W, C)
tensors; its weights, biases and attributes stay as they are. Traced steps hold NCHW ops only: the
optimizer's layout rules make the NHWC variants where transposes around them cancel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mlir_nn.ir.shapes import Shape

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


def in_layout(reference: Callable[..., np.ndarray], images: int = 1) -> Callable[[list, dict, Any], np.ndarray]:
    """A registry reference for an op whose first ``images`` operands and result are images, from
    ``reference(args, attrs)`` over NCHW arrays: NHWC operands transposed to NCHW and back."""

    def run(args: list, attrs: dict[str, Any], _state: Any) -> np.ndarray:
        if layout_of("reference", attrs) == NCHW:
            return reference(list(args), attrs)
        nchw = [np.transpose(a, TO_NCHW) if i < images else a for i, a in enumerate(args)]
        return np.ascontiguousarray(np.transpose(reference(nchw, without_layout(attrs)), TO_NHWC))

    return run
