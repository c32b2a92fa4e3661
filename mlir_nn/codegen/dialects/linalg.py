"""The linalg dialect's op classes and enums as MLIR's bindings load them when Python first
meets a linalg op or attribute, without ``mlir.dialects.linalg``'s op DSL (``linalg_ops``).
Importing ``mlir.dialects.linalg`` itself still gives the whole module."""

from mlir.dialects._linalg_enum_gen import *  # noqa: F403
from mlir.dialects._linalg_ops_gen import *  # noqa: F403
