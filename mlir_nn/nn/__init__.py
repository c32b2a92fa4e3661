"""Layers and models, as PyTorch groups them (``modules``)."""

from mlir_nn.nn.modules import MLP, Layer, Module

__all__ = ["MLP", "Layer", "Module"]
