"""Rewrite a step function so that parameter updates are written into the parameters.

``emit_linalg`` returns new parameter values as results (pure tensor semantics). A
backend that keeps state in caller-owned buffers calls ``write_updates_in_place``:

the step becomes a private ``@<name>_impl`` whose update results are
``bufferization.materialize_in_destination`` of the new value into the parameter argument
(placed after every other op, so each op reads the old state). One-shot bufferization then
proves which ops may compute straight into a parameter's buffer (copying where a later op
still reads the old value); the pipeline's ``drop-equivalent-buffer-results`` (which leaves
public functions as they are) removes the update results, now the argument buffers
themselves, and ``publish_step`` makes the function the public ``@<name>`` again.

(A public ``@<name>`` that called the private step and returned only the outputs made the
step's bufferization quadratic in its parameters: MLIR's analysis of that call, whose
hundreds of operands and results it queries one by one, copies the callee's aliasing table on
every query. Adam MLPs of width 64: one-shot-bufferize and eliminate-empty-tensors took
0.16/0.48 s at depth 16/32 with the call, 0.13/0.29 s without.)
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir.dialects import arith, bufferization, func, tensor

from mlir_nn.codegen import linalg_ops as linalg

IMPL_SUFFIX = "_impl"  # of the step's name while it is private (``write_updates_in_place``)


def _fresh_copy(value: ir.Value) -> ir.Value:
    """A copy of ``value`` in a new tensor (same shape, dynamic sizes included)."""
    kind = ir.RankedTensorType(value.type)
    sizes: list[int | ir.Value] = [
        tensor.dim(value, arith.constant(ir.IndexType.get(), i)) if kind.is_dynamic_dim(i) else d
        for i, d in enumerate(kind.shape)
    ]
    return linalg.copy(value, outs=[tensor.empty(sizes, kind.element_type)])


def write_updates_in_place(module: ir.Module, fn: func.FuncOp, n_outputs: int, update_args: Sequence[int],
                           wrapper: bool = False) -> None:
    """Make results ``n_outputs..`` of ``fn`` in-place writes to arguments ``update_args``.
    ``wrapper``: for a pipeline that does not drop the update results and inline (a user's), a
    public ``@<name>`` calls the private step and returns only the outputs, instead of
    ``publish_step`` making the step public again (the quadratic call above, but a valid step)."""
    name = ir.StringAttr(fn.sym_name).value
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    values = list(ret.operands)
    if len(values) != n_outputs + len(update_args):
        raise ValueError(f"write_updates_in_place: {len(values)} results, expected {n_outputs} + {len(update_args)}")
    arg_types = [a.type for a in block.arguments]
    with module.context, ret.location:
        kept = []
        for v in values:  # copies of argument values are taken first, before anything is written
            if isinstance(v.owner, ir.Block):
                with ir.InsertionPoint.at_block_begin(block):
                    v = _fresh_copy(v)
            elif v.owner.name == "tensor.reshape":
                with ir.InsertionPoint.after(v.owner):
                    v = _fresh_copy(v)
            kept.append(v)
    with module.context, ir.InsertionPoint(ret), ret.location:
        sources = kept[n_outputs:]
        for k in range(n_outputs):  # an output that is also written into a parameter gets its own copy
            if any(kept[k] == source for source in sources):
                kept[k] = _fresh_copy(kept[k])
        written = [
            bufferization.materialize_in_destination(block.arguments[i].type, source, block.arguments[i])
            for source, i in zip(kept[n_outputs:], update_args)
        ]
        func.ReturnOp(kept[:n_outputs] + written)
        ret.erase()
        fn.attributes["sym_name"] = ir.StringAttr.get(name + IMPL_SUFFIX)
        fn.attributes["sym_visibility"] = ir.StringAttr.get("private")
        del fn.attributes["llvm.emit_c_interface"]
        if not wrapper:
            return
        with ir.InsertionPoint(module.body):
            public = func.FuncOp(name, ir.FunctionType.get(arg_types, [v.type for v in kept[:n_outputs]]))
            public.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
            entry = public.add_entry_block()
        with ir.InsertionPoint(entry):
            func.ReturnOp(list(func.CallOp(fn, list(entry.arguments)).results)[:n_outputs])


def publish_step(module: ir.Module, name: str) -> None:
    """Once ``drop-equivalent-buffer-results`` has run: the private ``@<name>_impl`` that
    ``write_updates_in_place`` made is the public ``@<name>`` again, with its C interface."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name + IMPL_SUFFIX:
            with module.context:
                op.attributes["sym_name"] = ir.StringAttr.get(name)
                del op.attributes["sym_visibility"]
                op.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
            return
    raise ValueError(f"publish_step: no function @{name}{IMPL_SUFFIX} in the module")


def copy_repeated_results(module: ir.Module) -> None:
    """Give each returned buffer its own allocation (memref level, after bufferization).

    ``buffer-results-to-out-params`` crashes (MLIR 22) when one buffer is returned twice,
    which happens when an output repeats or when CSE merges two identical outputs.
    """
    from mlir.dialects import memref

    for fn in module.body.operations:
        if fn.operation.name != "func.func" or not fn.regions[0].blocks:
            continue
        ret = list(fn.regions[0].blocks[0].operations)[-1]
        seen: set[ir.Value] = set()
        with module.context, ir.InsertionPoint(ret), ret.location:
            for i, value in enumerate(list(ret.operands)):
                if value not in seen:
                    seen.add(value)
                    continue
                kind = ir.MemRefType(value.type)
                dynamic = [memref.dim(value, arith.constant(ir.IndexType.get(), d))
                           for d in range(kind.rank) if kind.is_dynamic_dim(d)]
                fresh = memref.alloc(ir.MemRefType.get(kind.shape, kind.element_type), dynamic, [])
                memref.copy(value, fresh)
                ret.operands[i] = fresh
