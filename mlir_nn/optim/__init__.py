"""Optimizers (``optimizers``) and learning-rate schedules (``lr_scheduler``), as PyTorch groups them."""

from mlir_nn.optim.lr_scheduler import CosineAnnealingLR, ExponentialLR, LambdaLR, LRScheduler, StepLR
from mlir_nn.optim.optimizers import SGD, Adam, Optimizer

__all__ = ["SGD", "Adam", "CosineAnnealingLR", "ExponentialLR", "LRScheduler", "LambdaLR", "Optimizer", "StepLR"]
