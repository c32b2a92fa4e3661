"""``mlir_nn.nn.functional`` (``F``): the functional forms of layers, activations and losses,
with PyTorch's names and semantics."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor, apply
from mlir_nn.losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def relu(x: Any) -> Tensor:
    return _tensor(x).relu()


def tanh(x: Any) -> Tensor:
    return _tensor(x).tanh()


def sigmoid(x: Any) -> Tensor:
    return _tensor(x).sigmoid()


def softmax(x: Any, dim: int = -1) -> Tensor:
    return _tensor(x).softmax(axis=dim)


def log_softmax(x: Any, dim: int = -1) -> Tensor:
    return _tensor(x).log_softmax(axis=dim)


def softplus(x: Any) -> Tensor:
    """log(1 + exp(x)), finite for any finite x (PyTorch's ``threshold`` shortcut is not taken)."""
    return apply("softplus", _tensor(x))


__all__ = ["cross_entropy", "log_softmax", "mse_loss", "relu", "sigmoid", "softmax", "tanh"]
__all__ += ["binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss", "l1_loss", "nll_loss",
            "smooth_l1_loss", "softplus"]  # losses (issue 21b)
