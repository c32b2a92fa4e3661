"""The tensor IR: nodes, the op registry, graphs, printer and verifier."""

from mlir_nn.ir import (
    sequence_ops,  # noqa: F401  (registers the sequence-model ops)
    windows,  # noqa: F401  (registers the conv, pooling and pad ops)
)
from mlir_nn.ir.graph import Graph, make_node, topo_order
from mlir_nn.ir.node import Node
from mlir_nn.ir.ops import OPS, OpDef, TensorType, op_def, register
from mlir_nn.ir.printer import print_graph
from mlir_nn.ir.shapes import BATCH, DTypeError, ShapeError
from mlir_nn.ir.verify import VerifyError, verify

__all__ = [
    "BATCH", "OPS", "DTypeError", "Graph", "Node", "OpDef", "ShapeError", "TensorType",
    "VerifyError", "make_node", "op_def", "print_graph", "register", "topo_order", "verify",
]
