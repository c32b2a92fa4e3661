"""Activation modules with PyTorch's names; each calls its functional form. ``inplace=True``
is accepted and computes out of place (a traced step has no aliasing to save)."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor
from mlir_nn.nn import functional as F
from mlir_nn.nn.module import Module


class ReLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x: Any) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class Tanh(Module):
    def forward(self, x: Any) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x: Any) -> Tensor:
        return F.sigmoid(x)


class GELU(Module):
    """x * Phi(x); ``approximate="tanh"`` for the tanh form."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Any) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()

    def forward(self, x: Any) -> Tensor:
        return F.silu(x)


def _legacy_dim(ndim: int) -> int:
    """PyTorch's choice when ``dim`` is None: 0 for 0-, 1- and 3-d input, else 1."""
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Any) -> Tensor:
        x = F._tensor(x)
        return F.softmax(x, _legacy_dim(x.ndim) if self.dim is None else self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, x: Any) -> Tensor:
        x = F._tensor(x)
        return F.log_softmax(x, _legacy_dim(x.ndim) if self.dim is None else self.dim)
