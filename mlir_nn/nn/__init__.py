"""Layers and models with PyTorch's names (``Module``, ``Parameter``, ``Linear``, ``Sequential``...),
tinynn's ``Layer`` and ``MLP``, and their functional forms (``functional``)."""

from mlir_nn.nn import functional
from mlir_nn.nn.activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from mlir_nn.nn.attention import CausalSelfAttention, MultiheadAttention
from mlir_nn.nn.container import ModuleDict, ModuleList, Sequential
from mlir_nn.nn.dropout import Dropout
from mlir_nn.nn.flatten import Flatten
from mlir_nn.nn.linear import Identity, Linear
from mlir_nn.nn.module import Module, Parameter
from mlir_nn.nn.modules import MLP, Layer
from mlir_nn.nn.normalization import BatchNorm1d, LayerNorm
from mlir_nn.nn.sparse import Embedding
from mlir_nn.nn.transformer import GPT

__all__ = ["GELU", "GPT", "MLP", "BatchNorm1d", "CausalSelfAttention", "Dropout", "Embedding", "Flatten", "Identity",
           "Layer", "LayerNorm", "LeakyReLU", "Linear", "LogSoftmax", "Module", "ModuleDict", "ModuleList",
           "MultiheadAttention", "Parameter", "ReLU", "Sequential", "SiLU", "Sigmoid", "Softmax", "Tanh", "functional"]
