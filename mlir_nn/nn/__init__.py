"""Layers and models (``modules``) and their functional forms (``functional``), as PyTorch
groups them."""

from mlir_nn.nn import functional
from mlir_nn.nn.conv import Conv2d
from mlir_nn.nn.modules import MLP, Layer, Module
from mlir_nn.nn.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d

__all__ = ["MLP", "AdaptiveAvgPool2d", "AvgPool2d", "Conv2d", "Layer", "MaxPool2d", "Module", "functional"]
