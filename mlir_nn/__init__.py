"""mlir-nn: a tensor autograd framework whose training steps compile through MLIR."""

from typing import Any

from mlir_nn.contractions import einsum
from mlir_nn.engine import (
    ConcretizationError,
    Tensor,
    Value,
    arange,
    bmm,
    cat,
    chunk,
    enable_grad,
    gather,
    index_select,
    is_grad_enabled,
    matmul,
    maximum,
    minimum,
    no_grad,
    split,
    stack,
    tril,
    triu,
    where,
)
from mlir_nn.jit import jit
from mlir_nn.jit.python_random import PythonRandomError
from mlir_nn.runtime.residency import resident, sync
from mlir_nn.support.version import __version__

__all__ = ["ConcretizationError", "PythonRandomError", "Tensor", "Value", "__version__", "arange", "bmm", "cat",
           "chunk", "einsum", "enable_grad", "gather", "index_select", "is_grad_enabled", "jit", "load", "manual_seed",
           "matmul", "maximum", "minimum", "no_grad", "resident", "save", "split", "stack", "sync", "tril", "triu",
           "where"]


def __getattr__(name: str) -> Any:
    """``save`` and ``load`` from ``mlir_nn.checkpoint``, imported on first use."""
    if name in ("save", "load"):
        from mlir_nn import checkpoint

        return getattr(checkpoint, name)
    if name == "manual_seed":  # dropout's generator and NumPy's (mlir_nn.nn.generator)
        from mlir_nn.nn.generator import manual_seed

        return manual_seed
    raise AttributeError(f"module 'mlir_nn' has no attribute {name!r}")
