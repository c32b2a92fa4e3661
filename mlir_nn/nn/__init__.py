"""Layers and models with PyTorch's names (``Module``, ``Parameter``, ``Linear``, ``Sequential``...),
tinynn's ``Layer`` and ``MLP``, and their functional forms (``functional``)."""

from mlir_nn.nn import functional
from mlir_nn.nn.activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from mlir_nn.nn.container import ModuleDict, ModuleList, Sequential
from mlir_nn.nn.conv import Conv2d
from mlir_nn.nn.dropout import Dropout
from mlir_nn.nn.flatten import Flatten
from mlir_nn.nn.linear import Identity, Linear
from mlir_nn.nn.module import Module, Parameter
from mlir_nn.nn.modules import MLP, Layer
from mlir_nn.nn.normalization import BatchNorm1d, LayerNorm
from mlir_nn.nn.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from mlir_nn.nn.spatial import BatchNorm2d, Dropout2d

__all__ = ["GELU", "MLP", "BatchNorm1d", "Dropout", "Flatten", "Identity", "Layer", "LayerNorm", "LeakyReLU",
           "Linear", "LogSoftmax", "Module", "ModuleDict", "ModuleList", "Parameter", "ReLU", "Sequential", "SiLU",
           "Sigmoid", "Softmax", "Tanh", "functional"]
__all__ += ["AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm2d", "Conv2d", "Dropout2d", "MaxPool2d"]  # issue 22
