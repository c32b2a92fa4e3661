"""Modules: Layer and MLP with tinynn's API, on tensors; PyTorch-shaped state dicts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, current_trace, stack, state_array
from mlir_nn.ir import DTypeError, ShapeError
from mlir_nn.ir.shapes import fmt_shape
from mlir_nn.jit.guards import TrackedList, structure_changed
from mlir_nn.runtime import residency

INITS = ("kaiming_uniform", "tinynn")


class Module:
    """Base class: a module owns parameters, can clear their gradients and save/load them."""

    def parameters(self) -> list[Tensor]:
        return []

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = 0

    def structure_key(self) -> tuple[int, ...]:
        """Identities of the parameter tensors: a compiled step re-traces when they change."""
        return tuple(map(id, self.parameters()))

    def structure_tracked(self) -> bool:
        """True when every change of ``structure_key()`` is reported to ``mlir_nn.jit.guards``: the
        key is read from attributes (set through ``__setattr__``) and tracked lists.
        Modules that compute ``parameters()`` some other way say False (the default)."""
        return False

    def __setattr__(self, name: str, value: Any) -> None:
        """Set the attribute and report a possible change of structure."""
        object.__setattr__(self, name, value)
        structure_changed()

    def __call__(self, x: Any) -> Tensor:
        raise NotImplementedError

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) for every parameter, in ``parameters()`` order: ``layers.0.W``.

        Names come from the attributes holding the tensors (sub-modules and lists of them
        recursed into); a parameter no attribute holds is named by its position.
        """
        found = {id(t): name for name, t in _walk(self, "")}
        return [(found.get(id(p), str(i)), p) for i, p in enumerate(self.parameters())]

    def state_dict(self) -> dict[str, np.ndarray]:
        """{name: copy of the parameter's array}, as PyTorch's ``state_dict`` (current also
        inside a resident block: newer device copies are fetched first)."""
        named = self.named_parameters()
        residency.fetch([p.data for _, p in named])
        return {name: p.data.copy() for name, p in named}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Copy ``state`` into the parameters in place; every entry is checked before any is written."""
        named = dict(self.named_parameters())
        missing = [k for k in named if k not in state]
        unexpected = [k for k in state if k not in named]
        if strict and (missing or unexpected):
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected}")
        checked = {name: state_array(state[name], f"{type(self).__name__}.load_state_dict: {name}", p.dtype,
                                     p.shape)
                   for name, p in named.items() if name in state}
        for name, value in checked.items():
            named[name].data[...] = value
        residency.written([named[name].data for name in checked])  # device copies are stale now


def _walk(obj: Any, prefix: str) -> Iterator[tuple[str, Tensor]]:
    for attr, value in vars(obj).items():
        yield from _walk_value(value, prefix + attr)


def _walk_value(value: Any, name: str) -> Iterator[tuple[str, Tensor]]:
    if isinstance(value, Tensor):
        yield name, value
    elif isinstance(value, Module):
        yield from _walk(value, name + ".")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk_value(item, f"{name}.{i}")


def _as_input(x: Any, dtype: str) -> Tensor:
    """The layer's input as a tensor of ``dtype``; a list of Values is stacked with autograd."""
    if isinstance(x, (list, tuple)) and x and any(isinstance(v, Tensor) for v in x):
        x = stack(list(x))
    if isinstance(x, Tensor) and x.dtype != dtype and current_trace() is not None:
        raise DTypeError(f"Layer: the input is {x.dtype}, the layer's weights are {dtype}; a compiled step "
                         f"computes in one dtype: pass {dtype} data (X.astype(np.{dtype})) or build the model "
                         f"with dtype=np.{x.dtype}")
    return x.astype(dtype) if isinstance(x, Tensor) else Tensor(x, dtype=dtype)


class Layer(Module):
    """A fully connected layer ``x @ W + b``, followed by ReLU when ``nonlin``.

    ``init="kaiming_uniform"`` (the default) is PyTorch's ``nn.Linear`` initialization:
    W and b uniform in (-1/sqrt(nin), 1/sqrt(nin)). ``init="tinynn"`` is the seed's: W
    uniform in (-1, 1), b zero. ``W`` has shape (nin, nout) and ``b`` shape (nout,).
    """

    def __init__(self, nin: int, nout: int, nonlin: bool = True, dtype: Any = np.float32,
                 name: str = "", init: str = "kaiming_uniform") -> None:
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
        self.W = Tensor(weights, dtype=dtype, label=f"{name}W")
        self.b = Tensor(bias, dtype=dtype, label=f"{name}b")

    def __call__(self, x: Any) -> Tensor:
        x = _as_input(x, self.W.dtype)
        if x.ndim == 0 or x.shape[-1] != self.nin:
            raise ShapeError(f"Layer: input has shape {fmt_shape(x.shape)}, expected (batch, {self.nin})")
        out = x @ self.W + self.b
        return out.relu() if self.nonlin else out

    def parameters(self) -> list[Tensor]:
        return [self.W, self.b]

    def structure_tracked(self) -> bool:
        return type(self).parameters is Layer.parameters

    def __repr__(self) -> str:
        return f"{'ReLU' if self.nonlin else 'Linear'}Layer({self.nin}, {self.nout})"


class MLP(Module):
    """A stack of layers; every layer but the last applies ReLU."""

    def __init__(self, nin: int, nouts: list[int], dtype: Any = np.float32, init: str = "kaiming_uniform") -> None:
        sizes = [nin] + list(nouts)
        self.layers = TrackedList(  # a list that reports layers added, removed or replaced
            Layer(sizes[i], sizes[i + 1], nonlin=i != len(nouts) - 1, dtype=dtype, name=f"L{i}.", init=init)
            for i in range(len(nouts))
        )

    def __call__(self, x: Any) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self) -> list[Tensor]:
        return [p for layer in self.layers for p in layer.parameters()]

    def structure_tracked(self) -> bool:
        return (type(self).parameters is MLP.parameters and isinstance(self.layers, TrackedList)
                and all(isinstance(layer, Module) and layer.structure_tracked() for layer in self.layers))

    def __repr__(self) -> str:
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
