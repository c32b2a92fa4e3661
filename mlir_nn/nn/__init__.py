"""Layers and models (``modules``) and their functional forms (``functional``), as PyTorch
groups them."""

from mlir_nn.nn import functional
from mlir_nn.nn.modules import MLP, Layer, Module

__all__ = ["MLP", "Layer", "Module", "functional"]
