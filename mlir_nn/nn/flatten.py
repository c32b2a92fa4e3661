"""``nn.Flatten``: merges dimensions start_dim..end_dim (all but the batch by default)."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor
from mlir_nn.nn import functional as F
from mlir_nn.nn.module import Module


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Tensor:
        return F.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
