"""Graph -> MLIR (linalg on tensors), shared by the compiled backends.

``emit_linalg(graph) -> ir.Module`` builds one function, ``func.func @<name>`` where
``<name>`` is ``symbol_name(graph)`` (the graph's name with non-identifier characters
replaced by ``_``), with the attribute ``llvm.emit_c_interface``:

* arguments: ``graph.inputs`` then ``graph.params``, in order, as ranked tensors; the
  batch symbol "N" is a dynamic dim (``tensor<?x2xf32>``), 0-d tensors for scalars;
* results: ``graph.outputs`` then the new value of each updated parameter, in
  ``graph.updates`` order;
* pure tensor semantics: nothing is updated in place (a backend that wants in-place
  parameter updates rewrites the module, see ``mlir_nn.codegen.inplace``).

Ops become ``linalg.matmul`` (transposes through indexing maps), ``linalg.generic`` for
elementwise ops, broadcasts and reductions (element counts of ``mean``/``mse`` are taken
at run time with ``tensor.dim``), ``tensor.reshape``, and fused ops (``linear``,
``gemm``, ``matmul_relu_grad``) as a matmul plus one elementwise epilogue written into
the matmul's result. ``const`` nodes are folded into the ops that use them.
"""

from mlir_nn.codegen.emit import emit_into, emit_linalg, symbol_name
from mlir_nn.codegen.lowering import LOWERINGS

__all__ = ["LOWERINGS", "emit_into", "emit_linalg", "symbol_name"]
