"""RMSprop (Hinton): steps scaled by a running root mean square of the gradients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlir_nn.engine import Tensor
from mlir_nn.optim.optimizers import Hyperparameter, Optimizer, flag, non_negative, zeros_like
from mlir_nn.support.domains import COUNT, NON_NEGATIVE


class RMSprop(Optimizer):
    """PyTorch's RMSprop: square_avg = alpha * square_avg + (1 - alpha) * grad^2; the step divides
    grad by sqrt(square_avg) + eps (centered: by sqrt(square_avg - grad_avg^2) + eps), through a
    momentum buffer when ``momentum`` is set. State (PyTorch's layout): ``step``, ``square_avg``,
    ``momentum_buffer`` (with momentum), ``grad_avg`` (centered)."""

    HYPERPARAMETERS = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")
    STATE = {"step": "scalar", "square_avg": "param", "momentum_buffer": "param", "grad_avg": "param"}
    STATE_DOMAINS = {"step": COUNT, "square_avg": NON_NEGATIVE}

    alpha = Hyperparameter(non_negative)
    eps = Hyperparameter(non_negative)
    weight_decay = Hyperparameter(non_negative)
    momentum = Hyperparameter(non_negative)
    centered = Hyperparameter(flag)

    def __init__(self, params: Any, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False) -> None:
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered))

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        if "step" not in state:
            state["step"] = Tensor(0.0, dtype=p.dtype, label=f"{p.label}.step")
            state["square_avg"] = zeros_like(p)
        if group.nonzero("momentum") and "momentum_buffer" not in state:
            state["momentum_buffer"] = zeros_like(p)
        if group["centered"] and "grad_avg" not in state:
            state["grad_avg"] = zeros_like(p)
        alpha, step = group["alpha"], state["step"]
        step += 1.0
        if group.nonzero("weight_decay"):
            grad = grad + group["weight_decay"] * p
        square_avg = state["square_avg"]
        square_avg *= alpha
        square_avg += (1 - alpha) * grad * grad
        if group["centered"]:
            grad_avg = state["grad_avg"]
            grad_avg *= alpha
            grad_avg += (1 - alpha) * grad
            avg = (square_avg - grad_avg * grad_avg).sqrt() + group["eps"]
        else:
            avg = square_avg.sqrt() + group["eps"]
        if group.nonzero("momentum"):
            buf = state["momentum_buffer"]
            buf *= group["momentum"]
            buf += grad / avg
            p -= group["lr"] * buf
        else:
            p -= group["lr"] * grad / avg
