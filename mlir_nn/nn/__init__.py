"""Layers and models with PyTorch's names (``Module``, ``Parameter``, ``Linear``, ``Sequential``...),
tinynn's ``Layer`` and ``MLP``, and their functional forms (``functional``)."""

from mlir_nn.nn import functional, utils
from mlir_nn.nn.activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from mlir_nn.nn.attention import CausalSelfAttention, MultiheadAttention
from mlir_nn.nn.container import ModuleDict, ModuleList, Sequential
from mlir_nn.nn.conv import Conv2d
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
from mlir_nn.nn.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from mlir_nn.nn.sparse import Embedding
from mlir_nn.nn.spatial import BatchNorm2d, Dropout2d
from mlir_nn.nn.transformer import GPT

__all__ = ["GELU", "GPT", "MLP", "AdaptiveAvgPool2d", "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d",
           "BatchNorm2d", "CausalSelfAttention", "Conv2d", "CrossEntropyLoss", "Dropout", "Dropout2d", "Embedding",
           "Flatten", "HuberLoss", "Identity", "L1Loss", "Layer", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax",
           "MSELoss", "MaxPool2d", "Module", "ModuleDict", "ModuleList", "MultiheadAttention", "NLLLoss", "Parameter",
           "ReLU", "Sequential", "SiLU", "Sigmoid", "SmoothL1Loss", "Softmax", "Tanh", "functional", "utils"]
