"""AdamW (Loshchilov & Hutter): Adam with weight decay applied to the parameter, not the gradient."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlir_nn.engine import Tensor
from mlir_nn.optim.optimizers import Hyperparameter, Optimizer, adam_step, betas_pair, non_negative


class AdamW(Optimizer):
    """PyTorch's AdamW: p *= 1 - lr * weight_decay; then Adam's bias-corrected step.
    State per parameter (PyTorch's layout): ``step`` (0-d), ``exp_avg``, ``exp_avg_sq``."""

    HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")
    STATE = {"step": "scalar", "exp_avg": "param", "exp_avg_sq": "param"}

    betas = Hyperparameter(betas_pair)
    eps = Hyperparameter(non_negative)
    weight_decay = Hyperparameter(non_negative)

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        if group.nonzero("weight_decay"):
            p *= 1 - group["lr"] * group["weight_decay"]
        adam_step(p, grad, state, group)
