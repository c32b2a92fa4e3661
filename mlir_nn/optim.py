"""Optimizers with PyTorch's update rules, written in tensor ops.

``step`` uses ``Tensor.assign``: eagerly it writes the new values in place; inside
``mlir_nn.jit`` it becomes parameter updates of the traced step. State (momentum
buffers, Adam moments, bias-correction powers) are tensors too, so they live in the
compiled step as parameters.
"""

from __future__ import annotations

import numpy as np

from mlir_nn.engine import Tensor


class Optimizer:
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

    def step(self) -> None:
        for p in self.parameters:
            if p._grad is not None:
                self._update(p, p._grad)

    def _update(self, p: Tensor, grad: Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """p -= lr * (momentum buffer of (grad + weight_decay * p))."""

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
