"""mlir-nn: a tensor autograd framework whose training steps compile through MLIR."""

from typing import Any

from mlir_nn.engine import (
    Tensor,
    Value,
    arange,
    bmm,
    cat,
    chunk,
    gather,
    index_select,
    matmul,
    split,
    stack,
    tril,
    triu,
    where,
)
from mlir_nn.jit import jit
from mlir_nn.runtime.residency import resident, sync
from mlir_nn.support.version import __version__

__all__ = ["Tensor", "Value", "__version__", "arange", "bmm", "cat", "chunk", "gather", "index_select", "jit", "load",
           "manual_seed", "matmul", "resident", "save", "split", "stack", "sync", "tril", "triu", "where"]


def __getattr__(name: str) -> Any:
    """``save`` and ``load`` from ``mlir_nn.checkpoint``, imported on first use."""
    if name in ("save", "load"):
        from mlir_nn import checkpoint

        return getattr(checkpoint, name)
    if name == "manual_seed":  # dropout's generator and NumPy's (mlir_nn.nn.generator)
        from mlir_nn.nn.generator import manual_seed

        return manual_seed
    raise AttributeError(f"module 'mlir_nn' has no attribute {name!r}")
