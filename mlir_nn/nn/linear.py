"""``nn.Linear`` and ``nn.Identity``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, current_trace, stack
from mlir_nn.ir import DTypeError, ShapeError
from mlir_nn.ir.shapes import fmt_shape
from mlir_nn.nn import functional as F
from mlir_nn.nn.module import Module, Parameter


def as_input(x: Any, dtype: str) -> Tensor:
    """A layer's input as a tensor of ``dtype``; a list of Values is stacked with autograd."""
    if isinstance(x, (list, tuple)) and x and any(isinstance(v, Tensor) for v in x):
        x = stack(list(x))
    if isinstance(x, Tensor) and x.dtype != dtype and current_trace() is not None:
        raise DTypeError(f"Layer: the input is {x.dtype}, the layer's weights are {dtype}; a compiled step "
                         f"computes in one dtype: pass {dtype} data (X.astype(np.{dtype})) or build the model "
                         f"with dtype=np.{x.dtype}")
    return x.astype(dtype) if isinstance(x, Tensor) else Tensor(x, dtype=dtype)


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    """Uniform in (-bound, bound), from NumPy's global generator (``mlir_nn.manual_seed`` seeds it)."""
    return np.random.uniform(-bound, bound, size=shape)


def positive(owner: str, **sizes: Any) -> None:
    """A clear ValueError unless every size is a positive int."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape (out_features, in_features), as PyTorch.

    Initialized as PyTorch's: weight and bias uniform in (-1/sqrt(in_features), 1/sqrt(in_features)).
    ``dtype`` defaults to float32 (PyTorch's default); the input is (*, in_features).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = np.float32) -> None:
        super().__init__()
        positive("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = int(in_features), int(out_features)
        bound = 1.0 / math.sqrt(self.in_features)  # Kaiming-uniform with a = sqrt(5), as PyTorch's
        self.weight = Parameter(uniform((self.out_features, self.in_features), bound), dtype=dtype, label="weight")
        if bias:
            self.bias = Parameter(uniform((self.out_features,), bound), dtype=dtype, label="bias")
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Any) -> Tensor:
        x = as_input(x, self.weight.dtype)
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(f"Linear: input has shape {fmt_shape(x.shape)}, expected (*, {self.in_features})")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Identity(Module):
    """Returns its input (arguments to the constructor are accepted and ignored, as PyTorch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x
