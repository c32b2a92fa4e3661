"""``nn.BatchNorm2d`` and ``nn.Dropout2d``: BatchNorm1d's statistics and Dropout's Philox masks
applied per channel of NCHW images."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape
from mlir_nn.nn import functional as F
from mlir_nn.nn.linear import as_input
from mlir_nn.nn.module import Module
from mlir_nn.nn.normalization import BatchNorm1d


def _image(owner: str, x: Tensor) -> tuple[Any, int, int, int]:
    if x.ndim != 4:
        raise ShapeError(f"{owner}: input has shape {fmt_shape(x.shape)}, expected (N, C, H, W)")
    return x.shape


class BatchNorm2d(BatchNorm1d):
    """Per-channel batch normalization of (N, C, H, W) input (statistics over N, H and W), with
    BatchNorm1d's parameters, buffers, defaults and running-statistics updates."""

    def forward(self, x: Any) -> Tensor:
        x = as_input(x, self._dtype)
        n, c, h, w = _image("BatchNorm2d", x)
        return super().forward(x.reshape(n, c, h * w)).reshape(n, c, h, w)


class Dropout2d(Module):
    """Zero whole channels with probability ``p`` (scaling the rest by 1/(1 - p)) in training mode.

    A 3-D input is (N, C, L), as PyTorch reads it (channel-wise 1-D dropout: one draw per
    (n, c) row), not an unbatched (C, H, W) image."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p = F._probability("Dropout2d", p)

    def forward(self, x: Any) -> Tensor:
        x = x if isinstance(x, Tensor) else Tensor(x)
        if x.ndim not in (3, 4):
            raise ShapeError(f"Dropout2d: input has shape {fmt_shape(x.shape)}, expected (N, C, H, W) or (N, C, L)")
        if not self.training or self.p == 0.0:
            return x
        per_channel = tuple(x.shape[:2]) + (1,) * (x.ndim - 2)
        keep = F.dropout(apply("broadcast_to", 1.0, shape=per_channel).astype(x.dtype), self.p, True)
        return x * keep

    def extra_repr(self) -> str:
        return f"p={self.p}"
