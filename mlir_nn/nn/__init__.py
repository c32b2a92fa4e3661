"""Layers and models (``modules``) and their functional forms (``functional``), as PyTorch
groups them."""

from mlir_nn.nn import functional, utils
from mlir_nn.nn.loss import (  # losses (issue 21b)
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from mlir_nn.nn.modules import MLP, Layer, Module

__all__ = ["MLP", "Layer", "Module", "functional", "utils"]
__all__ += ["BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "L1Loss", "MSELoss", "NLLLoss",
            "SmoothL1Loss"]  # losses (issue 21b)
