"""``nn.Dropout``: random zeroing in training mode (Philox masks, ``F.dropout``), identity in eval mode."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor
from mlir_nn.nn import functional as F
from mlir_nn.nn.module import Module


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p = F._probability("Dropout", p)

    def forward(self, x: Any) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
