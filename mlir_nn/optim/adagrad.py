"""Adagrad (Duchi et al.): per-coordinate steps scaled by the root of the summed squared gradients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.jit.guards import TrackedDict
from mlir_nn.optim.optimizers import Hyperparameter, Optimizer, non_negative
from mlir_nn.support.domains import COUNT, NON_NEGATIVE


class Adagrad(Optimizer):
    """PyTorch's Adagrad: sum += grad^2; p -= lr / (1 + (step - 1) * lr_decay) * grad / (sqrt(sum) + eps).
    State (PyTorch's layout, made at construction as PyTorch does): ``step`` (0-d) and ``sum``
    (starting at ``initial_accumulator_value``)."""

    HYPERPARAMETERS = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")
    STATE = {"step": "scalar", "sum": "param"}
    STATE_DOMAINS = {"step": COUNT, "sum": NON_NEGATIVE}

    lr_decay = Hyperparameter(non_negative)
    weight_decay = Hyperparameter(non_negative)
    initial_accumulator_value = Hyperparameter(non_negative)
    eps = Hyperparameter(non_negative)

    def __init__(self, params: Any, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10) -> None:
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[id(p)] = TrackedDict(
                    step=Tensor(0.0, dtype=p.dtype, label=f"{p.label}.step"),
                    sum=Tensor(np.full(p.shape, group["initial_accumulator_value"]), dtype=p.dtype,
                               label=f"{p.label}.sum"))

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        step, total = state["step"], state["sum"]
        step += 1.0
        if group.nonzero("weight_decay"):
            grad = grad + group["weight_decay"] * p
        lr = group["lr"]
        if group.nonzero("lr_decay"):
            lr = lr / (1 + (step - 1) * group["lr_decay"])
        total += grad * grad
        p -= lr * grad / (total.sqrt() + group["eps"])
