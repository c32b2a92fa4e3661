"""Modules: Layer and MLP with tinynn's API, on tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape


class Module:
    """Base class: a module owns parameters and can clear their gradients."""

    def parameters(self) -> list[Tensor]:
        return []

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = 0

    def structure_key(self) -> tuple[int, ...]:
        """Identities of the parameter tensors: a compiled step re-traces when they change."""
        return tuple(map(id, self.parameters()))

    def __call__(self, x: Any) -> Tensor:
        raise NotImplementedError


def _as_input(x: Any, dtype: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, Tensor) for v in x):
        return Tensor(np.stack([v.data for v in x]), dtype=dtype)
    return Tensor(x, dtype=dtype)


class Layer(Module):
    """A fully connected layer ``x @ W + b``, followed by ReLU when ``nonlin``.

    Weights start uniform in (-1, 1) as in tinynn and biases at zero. ``W`` has shape
    (nin, nout) and ``b`` shape (nout,).
    """

    def __init__(self, nin: int, nout: int, nonlin: bool = True, dtype: Any = np.float32,
                 name: str = "") -> None:
        if nin < 1 or nout < 1:
            raise ValueError(f"Layer: nin and nout must be positive, got nin={nin}, nout={nout}")
        self.nin, self.nout, self.nonlin = nin, nout, nonlin
        self.W = Tensor(np.random.uniform(-1.0, 1.0, size=(nin, nout)), dtype=dtype, label=f"{name}W")
        self.b = Tensor(np.zeros(nout), dtype=dtype, label=f"{name}b")

    def __call__(self, x: Any) -> Tensor:
        x = _as_input(x, self.W.dtype)
        if x.ndim == 0 or x.shape[-1] != self.nin:
            raise ShapeError(f"Layer: input has shape {fmt_shape(x.shape)}, expected (batch, {self.nin})")
        out = x @ self.W + self.b
        return out.relu() if self.nonlin else out

    def parameters(self) -> list[Tensor]:
        return [self.W, self.b]

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Layer({self.nin}, {self.nout})"


class MLP(Module):
    """A stack of layers; every layer but the last applies ReLU."""

    def __init__(self, nin: int, nouts: list[int], dtype: Any = np.float32) -> None:
        sizes = [nin] + list(nouts)
        self.layers = [
            Layer(sizes[i], sizes[i + 1], nonlin=i != len(nouts) - 1, dtype=dtype, name=f"L{i}.")
            for i in range(len(nouts))
        ]

    def __call__(self, x: Any) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self) -> list[Tensor]:
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
