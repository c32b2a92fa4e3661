"""Graph -> MLIR module: one ``func.func`` on tensors, built with the MLIR Python bindings."""

from __future__ import annotations

import re
from dataclasses import replace

from mlir import ir
from mlir.dialects import arith, func, tensor

from mlir_nn.codegen.builder import Deferred, FunctionBuilder, Operand, Scalar
from mlir_nn.codegen.lowering import ELEMENTWISE, LOWERINGS
from mlir_nn.codegen.tensor_types import tensor_type
from mlir_nn.ir import BATCH, Graph, Node


def symbol_name(graph: Graph) -> str:
    """The function's symbol: the graph's name with anything but [A-Za-z0-9_] replaced by '_'."""
    name = re.sub(r"\W", "_", graph.name, flags=re.ASCII) or "step"
    return name if not name[0].isdigit() else "_" + name


def graph_dtype(graph: Graph) -> str:
    dtypes = {n.dtype for n in graph.nodes} | {n.dtype for n in graph.inputs + graph.params}
    if len(dtypes) != 1:
        raise TypeError(f"codegen: graph {graph.name} mixes dtypes {sorted(dtypes)}; expected one dtype")
    return dtypes.pop()


def _batch_size(args: list[tuple[Node, ir.Value]]) -> ir.Value | None:
    """tensor.dim of the first argument that has the batch dimension."""
    for node, value in args:
        if BATCH in node.shape:
            position = arith.constant(ir.IndexType.get(), node.shape.index(BATCH))
            return tensor.dim(value, position)
    return None


def emit_into(module: ir.Module, graph: Graph, wide_sums: bool = False, strided_copies: bool = False,
              batch_tasks: bool = False, scalars: bool = False) -> func.FuncOp:
    """Append the step function of ``graph`` to ``module`` (inside its context); ``wide_sums``
    accumulates float32 reductions in float64 (``mlir_nn.codegen.accumulate``); ``strided_copies``
    pads and spreads window operands by strided slice copies (targets that lower subviews);
    ``batch_tasks`` runs the loops of batched products as tasks (``scf.forall``); ``scalars``
    computes 0-d element-wise results in the function's body (``builder.Scalar``: host code)."""
    missing = sorted({n.op for n in graph.nodes} - set(LOWERINGS) - {"input", "param", "const"})
    if missing:
        raise NotImplementedError(f"codegen: no lowering for op(s) {', '.join(missing)}")
    dtype = graph_dtype(graph)
    leaves = list(graph.inputs) + list(graph.params)
    results = list(graph.outputs) + [node for _, node in graph.updates]
    signature = ir.FunctionType.get([tensor_type(n.shape, n.dtype) for n in leaves],
                                    [tensor_type(n.shape, n.dtype) for n in results])
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp(symbol_name(graph), signature)
        fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        entry = fn.add_entry_block()
    with ir.InsertionPoint(entry):
        values: dict[Node, Operand] = dict(zip(leaves, entry.arguments))
        b = FunctionBuilder(dtype, _batch_size(list(zip(leaves, entry.arguments))), wide_sums, strided_copies,
                            batch_tasks, scalars)
        b.results = set(results)
        for node in graph.nodes:
            for i in dict.fromkeys(node.inputs):
                b.readers.setdefault(i, []).append(node)
        for node in graph.nodes:
            if node in values:
                continue
            if node.op == "const":
                values[node] = float(node.attr("value"))
                continue
            operands = [values[i] for i in node.inputs]
            if node.op not in ELEMENTWISE:
                operands = [b.built(value) for value in operands]
            b.defer_next = _deferred(b, node)
            with ir.Location.name(f"{node.op}{list(node.shape)}"):
                value = LOWERINGS[node.op](b, node, operands)
            b.defer_next = False
            if node in b.results and isinstance(value, Deferred):
                value = replace(value, result=True)
            elif node in b.results and isinstance(value, Scalar):
                b.built(value)  # stored here: kept to the return, its arithmetic reached across the step's
                # kernels (kernel_split), one kernel of the whole backward (a 784-1024-1024-10 step: +8%)
            values[node] = value
        func.ReturnOp([b.tensor_of(b.built(values[n]), n.shape) for n in results])
    return fn


def _deferred(b: FunctionBuilder, node: Node) -> bool:
    """Whether ``node`` is computed inside its reader's body (``builder.Deferred``): an
    element-wise op whose one reader is an element-wise op of its shape. A result (an
    optimizer's new m and v, read by the parameter's update) is then also an output of the op
    that computes it: Adam's three passes over a parameter's shape one generic, not three."""
    readers = b.readers.get(node, [])
    return (node.op in ELEMENTWISE and len(readers) == 1 and readers[0].op in ELEMENTWISE
            and readers[0].shape == node.shape)


def emit_linalg(
    graph: Graph, context: ir.Context | None = None, wide_sums: bool = False, strided_copies: bool = False,
    batch_tasks: bool = False, scalars: bool = False,
) -> ir.Module:
    """The MLIR module of ``graph`` (see the package docstring for the function convention)."""
    context = context or ir.Context()
    with context, ir.Location.unknown():
        module = ir.Module.create()
        emit_into(module, graph, wide_sums, strided_copies, batch_tasks, scalars)
        if not module.operation.verify():
            raise RuntimeError(f"codegen: the module emitted for {graph.name} does not verify")
    return module
