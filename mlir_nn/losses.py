"""Loss functions."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape


def mse_loss(pred: Any, target: Any) -> Tensor:
    """Mean squared error over all elements; shapes must match exactly."""
    pred = pred if isinstance(pred, Tensor) else Tensor(pred)
    target = target if isinstance(target, Tensor) else Tensor(target, dtype=pred.dtype)
    return apply("mse", pred, target)


def cross_entropy(logits: Any, target: Any) -> Tensor:
    """PyTorch's ``cross_entropy`` with reduction='mean' for logits (batch, classes).

    ``target`` holds integer class labels (batch,) or class probabilities (batch, classes);
    the loss is mean over rows of -sum(target * log_softmax(logits)).
    """
    logits = logits if isinstance(logits, Tensor) else Tensor(logits)
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must have shape (batch, classes), got {fmt_shape(logits.shape)}")
    target = target if isinstance(target, Tensor) else Tensor(target, dtype=logits.dtype)
    if target.ndim == 1:
        if target.shape[0] != logits.shape[0]:
            raise ShapeError(f"cross_entropy: labels {fmt_shape(target.shape)} do not match logits "
                             f"{fmt_shape(logits.shape)}; expected one label per row")
        target = apply("one_hot", target, classes=int(logits.shape[1]))
    elif target.shape != logits.shape:
        raise ShapeError(f"cross_entropy: target {fmt_shape(target.shape)} does not match logits "
                         f"{fmt_shape(logits.shape)}; expected labels (batch,) or probabilities (batch, classes)")
    return -(logits.log_softmax(axis=1) * target).sum(axis=1).mean()
