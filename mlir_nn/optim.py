"""Optimizers with PyTorch's update rules, written in tensor ops.

``step`` uses ``Tensor.assign``: eagerly it writes the new values in place; inside
``mlir_nn.jit`` it becomes parameter updates of the traced step. State (momentum
buffers, Adam moments, bias-correction powers) are tensors too, so they live in the
compiled step as parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError


class Optimizer:
    HYPERPARAMETERS: tuple[str, ...] = ("lr",)  # what state_dict saves in its param group

    def __init__(self, params: list[Tensor], lr: float) -> None:
        self.parameters = list(params)
        if not self.parameters:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if lr <= 0:
            raise ValueError(f"{type(self).__name__}: lr must be positive, got {lr}")
        self.lr = lr
        self.state: dict[int, dict[str, Tensor]] = {}

    def zero_grad(self) -> None:
        for p in self.parameters:
            p.grad = 0

    def _state(self, p: Tensor, name: str, init: float = 0.0, shape: tuple | None = None) -> Tensor:
        slot = self.state.setdefault(id(p), {})
        if name not in slot:
            slot[name] = Tensor(np.full(p.shape if shape is None else shape, init), dtype=p.dtype,
                                label=f"{p.label}.{name}")
        return slot[name]

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's shape: {"state": {param index: {name: array}}, "param_groups": [{hyper..., "params": [...]}]}."""
        index = {id(p): i for i, p in enumerate(self.parameters)}
        state = {index[key]: {name: t.data.copy() for name, t in slot.items()}
                 for key, slot in self.state.items() if key in index}
        group = {name: getattr(self, name) for name in self.HYPERPARAMETERS}
        return {"state": state, "param_groups": [group | {"params": list(range(len(self.parameters)))}]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore hyperparameters and state (in place where it exists, so compiled steps see it)."""
        name = f"{type(self).__name__}.load_state_dict"
        groups, states = state_dict.get("param_groups"), state_dict.get("state")
        if not isinstance(groups, (list, tuple)) or len(groups) != 1 or not isinstance(states, Mapping):
            raise ValueError(f"{name}: expected {{'state': {{...}}, 'param_groups': [one group]}}")
        if list(groups[0].get("params", ())) != list(range(len(self.parameters))):
            raise ValueError(f"{name}: the saved group has params {groups[0].get('params')}, this optimizer has "
                             f"{len(self.parameters)} parameters")
        arrays: dict[tuple[int, str], np.ndarray] = {}
        for i, slot in states.items():
            p = self.parameters[int(i)]
            for key, value in slot.items():
                value = np.asarray(value)
                existing = self.state.get(id(p), {}).get(key)
                expected = existing.shape if existing is not None else value.shape
                if value.shape != expected or value.shape not in (p.shape, ()):
                    raise ShapeError(f"{name}: state {key} of parameter {i} has shape {value.shape}, expected "
                                     f"{expected if existing is not None else p.shape}")
                arrays[(int(i), key)] = value
        for hyper in self.HYPERPARAMETERS:
            if hyper in groups[0]:
                value = groups[0][hyper]
                setattr(self, hyper, tuple(value) if isinstance(value, (list, tuple)) else float(value))
        for (i, key), value in arrays.items():
            p = self.parameters[i]
            slot = self.state.setdefault(id(p), {})
            if key in slot:
                slot[key].data[...] = value
            else:
                slot[key] = Tensor(value, dtype=p.dtype, label=f"{p.label}.{key}")

    def step(self) -> None:
        for p in self.parameters:
            if p._grad is not None:
                self._update(p, p._grad)

    def _update(self, p: Tensor, grad: Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """p -= lr * (momentum buffer of (grad + weight_decay * p))."""

    HYPERPARAMETERS = ("lr", "momentum", "weight_decay")

    def __init__(self, params: list[Tensor], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: momentum and weight_decay must be >= 0, got {momentum}, {weight_decay}")
        self.momentum, self.weight_decay = momentum, weight_decay

    def _update(self, p: Tensor, grad: Tensor) -> None:
        if self.weight_decay:
            grad = grad + self.weight_decay * p
        if self.momentum:
            # The buffer starts at zero, so the first step sets it to grad, as PyTorch does.
            buf = self._state(p, "momentum_buffer")
            new_buf = self.momentum * buf + grad
            buf.assign(new_buf)
            grad = new_buf
        p.assign(p - self.lr * grad)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with PyTorch's bias correction and L2 weight_decay."""

    HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"Adam: betas must be in [0, 1), got {betas}")
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def _update(self, p: Tensor, grad: Tensor) -> None:
        b1, b2 = self.betas
        if self.weight_decay:
            grad = grad + self.weight_decay * p
        m, v = self._state(p, "exp_avg"), self._state(p, "exp_avg_sq")
        b1_pow, b2_pow = self._state(p, "beta1_power", 1.0, ()), self._state(p, "beta2_power", 1.0, ())
        new_b1_pow, new_b2_pow = b1_pow * b1, b2_pow * b2
        new_m = b1 * m + (1 - b1) * grad
        new_v = b2 * v + (1 - b2) * (grad * grad)
        m_hat = new_m / (1 - new_b1_pow)
        v_hat = new_v / (1 - new_b2_pow)
        p.assign(p - self.lr * m_hat / (v_hat.sqrt() + self.eps))
        for state, value in ((m, new_m), (v, new_v), (b1_pow, new_b1_pow), (b2_pow, new_b2_pow)):
            state.assign(value)


from mlir_nn.lr_scheduler import CosineAnnealingLR, ExponentialLR, LambdaLR, LRScheduler, StepLR  # noqa: E402

__all__ = ["SGD", "Adam", "CosineAnnealingLR", "ExponentialLR", "LRScheduler", "LambdaLR", "Optimizer", "StepLR"]
