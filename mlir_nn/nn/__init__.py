"""Layers and models with PyTorch's names (``Module``, ``Parameter``, ``Linear``, ``Sequential``...),
tinynn's ``Layer`` and ``MLP``, and their functional forms (``functional``)."""

from mlir_nn.nn import functional, utils
from mlir_nn.nn.activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from mlir_nn.nn.container import ModuleDict, ModuleList, Sequential
from mlir_nn.nn.dropout import Dropout
from mlir_nn.nn.flatten import Flatten
from mlir_nn.nn.linear import Identity, Linear
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
from mlir_nn.nn.module import Module, Parameter
from mlir_nn.nn.modules import MLP, Layer
from mlir_nn.nn.normalization import BatchNorm1d, LayerNorm

__all__ = ["GELU", "MLP", "BatchNorm1d", "Dropout", "Flatten", "Identity", "Layer", "LayerNorm", "LeakyReLU",
           "Linear", "LogSoftmax", "Module", "ModuleDict", "ModuleList", "Parameter", "ReLU", "Sequential", "SiLU",
           "Sigmoid", "Softmax", "Tanh", "functional", "utils"]
__all__ += ["BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "L1Loss", "MSELoss", "NLLLoss",
            "SmoothL1Loss"]  # losses (issue 21b)
