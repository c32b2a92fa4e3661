"""AdamW (Loshchilov & Hutter): Adam with weight decay applied to the parameter, not the gradient."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlir_nn.engine import Tensor
from mlir_nn.optim.optimizers import Adam, adam_step


class AdamW(Adam):
    """PyTorch's AdamW: p *= 1 - lr * weight_decay; then Adam's bias-corrected step (Adam's
    hyperparameters and state layout, a decay of 1e-2 by default)."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        if group.nonzero("weight_decay"):
            p *= 1 - group["lr"] * group["weight_decay"]
        adam_step(p, grad, state, group)
