"""A shape-aware cost model: estimated FLOPs + bytes moved + a fixed cost per kernel.

Costs are in FLOP-equivalents. Every op that is not a leaf or a view is one kernel: it
pays ``launch``, reads its tensor operands and writes its result once (scalar constants
are free: they travel as kernel arguments). A fused op therefore costs less than the ops
it replaces exactly by the launches and the intermediate tensors it no longer writes
and reads back: fusion pays off only where it saves memory traffic. The batch dimension
is counted as ``batch`` rows, the traced batch size by default. A convolution costs what the
form the code generator will lower it to costs (``mlir_nn.ir.conv_forms``: multiply-adds at that
form's rate, the bytes its im2col or col2im columns, padded copies and transposes move, its
launches), converted to FLOP-equivalents at one per byte streamed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlir_nn.ir import Graph, conv_forms
from mlir_nn.ir.layouts import layout_of
from mlir_nn.ir.shapes import Shape, numel

FREE = ("leaf", "input", "param", "const", "reshape")  # no kernel: data already there, or a view
TRANSCENDENTAL = ("exp", "log", "tanh", "sigmoid", "sqrt", "pow", "tanh_grad", "sigmoid_grad",
                  "log_softmax", "log_softmax_grad", "softmax_xent_grad", "softmax", "softmax_grad")
MATMULS = ("matmul", "linear", "gemm", "matmul_relu_grad")


@dataclass(frozen=True)
class CostModel:
    """Weights of the three terms; ``batch`` stands for the symbolic batch dimension."""

    batch: int = 128
    flop: float = 1.0
    byte: float = 1.0
    launch: float = 4096.0
    transcendental_flops: float = 8.0

    def node_cost(self, op: str, attrs: dict[str, Any], in_shapes: Sequence[Shape], out_shape: Shape,
                  itemsize: int) -> float:
        """Cost of one node from its op, attributes and operand/result shapes."""
        if op in FREE:
            return 0.0
        if op in conv_forms.CONV_OPS:
            named = dict(attrs["opaque"]) if "opaque" in attrs else attrs  # (an op the rules do not rewrite)
            shape = conv_forms.conv_shape(op, in_shapes, out_shape, named, self.batch, itemsize)
            cost_ns = conv_forms.conv_cost_ns(op, shape, layout_of(op, named))
            return self.byte * conv_forms.BYTES_PER_NS * cost_ns + self.launch
        out = numel(out_shape, self.batch)
        if op == "transpose" and len(out_shape) == 4:  # an image between NCHW and NHWC, priced as the convs' moves
            return self.byte * conv_forms.BYTES_PER_NS * conv_forms.transpose_ns(out * itemsize) + self.launch
        ins = [numel(s, self.batch) for s in in_shapes if len(s)]  # scalars ride along as arguments
        moved = (sum(ins) + out) * itemsize
        if op in MATMULS:
            a = in_shapes[0]
            k = numel((a[0],) if attrs.get("transpose_a") else (a[1],), self.batch)
            flops = 2.0 * out * k + (out if op != "matmul" else 0)  # + the epilogue
        elif op in ("sum_to", "sum", "mean", "mse", "mse_grad"):
            flops = float(max(ins) if ins else out) * (3 if op.startswith("mse") else 1)
        elif op in ("transpose", "broadcast_to"):
            flops = 0.0
        else:
            flops = float(out) * (self.transcendental_flops if op in TRANSCENDENTAL else 1.0)
        return self.flop * flops + self.byte * moved + self.launch

    def graph_cost(self, graph: Graph) -> float:
        """Cost of running every node of ``graph`` once (shared nodes counted once)."""
        return sum(
            self.node_cost(n.op, n.attr_dict, [i.shape for i in n.inputs], n.shape, np.dtype(n.dtype).itemsize)
            for n in graph.nodes
        )

    def kernels(self, graph: Graph) -> int:
        return sum(1 for n in graph.nodes if n.op not in FREE)
