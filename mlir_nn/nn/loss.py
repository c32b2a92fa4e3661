"""Loss modules with PyTorch's names: each holds its options and calls ``mlir_nn.losses``."""

from __future__ import annotations

from typing import Any

from mlir_nn import losses
from mlir_nn.engine import Tensor
from mlir_nn.nn.module import Module


class _Loss(Module):
    """A loss module: ``loss(input, target)`` runs ``forward``."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        losses._check_reduction(type(self).__name__, reduction)
        self.reduction = reduction

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002 (PyTorch's names)
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reduction={self.reduction!r})"


class MSELoss(_Loss):
    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = beta

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = delta

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCELoss(_Loss):
    def __init__(self, weight: Any = None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.weight = weight

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None) -> None:
        super().__init__(reduction)
        self.weight, self.pos_weight = weight, pos_weight

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction,
                                                       pos_weight=self.pos_weight)


class CrossEntropyLoss(_Loss):
    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(reduction)
        self.weight, self.ignore_index, self.label_smoothing = weight, ignore_index, label_smoothing

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                                    reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_Loss):
    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self.weight, self.ignore_index = weight, ignore_index

    def forward(self, input: Any, target: Any) -> Tensor:  # noqa: A002
        return losses.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction)
