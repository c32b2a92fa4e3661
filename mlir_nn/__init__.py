"""mlir-nn: a tensor autograd framework whose training steps compile through MLIR."""

from mlir_nn.checkpoint import load, save
from mlir_nn.engine import Tensor, Value
from mlir_nn.jit import jit
from mlir_nn.residency import resident, sync

__version__ = "0.1.0"

__all__ = ["Tensor", "Value", "__version__", "jit", "load", "resident", "save", "sync"]
