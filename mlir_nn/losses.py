"""Loss functions."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor, apply


def mse_loss(pred: Tensor, target: Any) -> Tensor:
    """Mean squared error over all elements; shapes must match exactly."""
    target = target if isinstance(target, Tensor) else Tensor(target, dtype=pred.dtype)
    return apply("mse", pred, target)
