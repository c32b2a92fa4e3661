"""Optimizers (``optimizers``) and learning-rate schedules (``lr_scheduler``), as PyTorch groups them."""

from mlir_nn.optim import lr_scheduler
from mlir_nn.optim.adagrad import Adagrad
from mlir_nn.optim.adamw import AdamW
from mlir_nn.optim.lr_scheduler import (
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    LRScheduler,
    OneCycleLR,
    ReduceLROnPlateau,
    StepLR,
)
from mlir_nn.optim.optimizers import SGD, Adam, Optimizer, zeros_like
from mlir_nn.optim.rmsprop import RMSprop

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "CosineAnnealingLR", "ExponentialLR", "LRScheduler", "LambdaLR",
           "OneCycleLR", "Optimizer", "RMSprop", "ReduceLROnPlateau", "StepLR", "lr_scheduler", "zeros_like"]
