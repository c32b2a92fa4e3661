"""tinynn's models, as compositions of ``nn.Module``: ``Layer(nin, nout, nonlin)`` with W of
shape (nin, nout) and b, and ``MLP(nin, nouts)`` holding its layers in a ``ModuleList``
(state_dict keys ``layers.0.W``, ``layers.0.b``...)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape
from mlir_nn.nn.container import ModuleList
from mlir_nn.nn.linear import as_input
from mlir_nn.nn.module import Module, Parameter

INITS = ("kaiming_uniform", "tinynn")


class Layer(Module):
    """A fully connected layer ``x @ W + b``, followed by ReLU when ``nonlin``.

    ``init="kaiming_uniform"`` (the default) is PyTorch's ``nn.Linear`` initialization:
    W and b uniform in (-1/sqrt(nin), 1/sqrt(nin)). ``init="tinynn"`` is the seed's: W
    uniform in (-1, 1), b zero. ``W`` has shape (nin, nout) and ``b`` shape (nout,).
    """

    def __init__(self, nin: int, nout: int, nonlin: bool = True, dtype: Any = np.float32,
                 name: str = "", init: str = "kaiming_uniform") -> None:
        super().__init__()
        if nin < 1 or nout < 1:
            raise ValueError(f"Layer: nin and nout must be positive, got nin={nin}, nout={nout}")
        if init not in INITS:
            raise ValueError(f"Layer: unknown init {init!r}; expected one of {', '.join(INITS)}")
        self.nin, self.nout, self.nonlin = nin, nout, nonlin
        if init == "tinynn":
            weights, bias = np.random.uniform(-1.0, 1.0, size=(nin, nout)), np.zeros(nout)
        else:
            bound = 1.0 / np.sqrt(nin)
            weights = np.random.uniform(-bound, bound, size=(nin, nout))
            bias = np.random.uniform(-bound, bound, size=nout)
        self.W = Parameter(weights, dtype=dtype, label=f"{name}W")
        self.b = Parameter(bias, dtype=dtype, label=f"{name}b")

    def forward(self, x: Any) -> Tensor:
        x = as_input(x, self.W.dtype)
        if x.ndim == 0 or x.shape[-1] != self.nin:
            raise ShapeError(f"Layer: input has shape {fmt_shape(x.shape)}, expected (batch, {self.nin})")
        out = x @ self.W + self.b
        return out.relu() if self.nonlin else out

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Layer({self.nin}, {self.nout})"


class MLP(Module):
    """A stack of layers; every layer but the last applies ReLU."""

    def __init__(self, nin: int, nouts: list[int], dtype: Any = np.float32, init: str = "kaiming_uniform") -> None:
        super().__init__()
        sizes = [nin] + list(nouts)
        self.layers = ModuleList(
            Layer(sizes[i], sizes[i + 1], nonlin=i != len(nouts) - 1, dtype=dtype, name=f"L{i}.", init=init)
            for i in range(len(nouts))
        )

    def forward(self, x: Any) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
