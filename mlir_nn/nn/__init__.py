"""Layers and models with PyTorch's names (``Module``, ``Parameter``, ``Linear``, ``Sequential``...),
tinynn's ``Layer`` and ``MLP``, and their functional forms (``functional``)."""

from mlir_nn.nn import functional
from mlir_nn.nn.container import ModuleDict, ModuleList, Sequential
from mlir_nn.nn.linear import Identity, Linear
from mlir_nn.nn.module import Module, Parameter
from mlir_nn.nn.modules import MLP, Layer

__all__ = ["MLP", "Identity", "Layer", "Linear", "Module", "ModuleDict", "ModuleList", "Parameter", "Sequential",
           "functional"]
