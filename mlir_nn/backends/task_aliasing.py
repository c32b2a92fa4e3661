"""``noalias`` on the buffers of a kernel's parallel loop bodies, as on the kernel's own.

``parallel_bodies`` moves the body of a kernel's parallel loop into a function of its own,
which takes the loop's buffers as arguments (memrefs); the ``noalias`` that ``kernel_split``
found for the kernel's buffers (their pointers) did not reach them, so LLVM kept every store of
a body (a per-channel partial sum, a packed panel) in memory where a value in a register would
do, and guarded vector loops with overlap checks. A body's buffer is marked when it views a
buffer of its kernel marked ``noalias`` (``kernel_split.NOALIAS``) that no other buffer of the
body views; this runs on the kernels right after the bodies are outlined, while each body is
still a ``func.func`` that its kernel calls with the buffers, and tags the body with NOALIAS as
``kernel_split`` tags kernels (the LLVM conversion drops ``llvm.noalias`` on memref arguments;
``kernel_build.mark_kernels`` applies the tag to the lowered functions).
"""

from __future__ import annotations

from mlir import ir

from mlir_nn.backends.kernel_split import NOALIAS, aligned_pointer_positions, kernel_buffers, root_buffer
from mlir_nn.backends.parallel_bodies import BODY_PREFIX
from mlir_nn.codegen.walk import symbol


def _noalias_buffers(kernel: ir.Operation) -> set[ir.Value]:
    """The buffers of ``kernel`` (``kernel_split.kernel_buffers``) whose pointer NOALIAS lists."""
    if NOALIAS not in kernel.attributes:
        return set()
    marked = set(ir.DenseI64ArrayAttr(kernel.attributes[NOALIAS]))
    return {buffer for buffer, position in kernel_buffers(kernel).items() if position in marked}


def _task_calls(kernel: ir.Operation) -> list[ir.Operation]:
    calls: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value.startswith(BODY_PREFIX):
            calls.append(op)
        return ir.WalkResult.ADVANCE

    kernel.walk(visit)
    return calls


def _marked_parameters(call: ir.Operation, noalias: set[ir.Value]) -> list[bool]:
    """For each operand of ``call``: whether it views one of the ``noalias`` buffers of its
    kernel that no other operand views."""
    roots = [root_buffer(v) if isinstance(v.type, ir.MemRefType) else None for v in call.operands]
    marked = []
    for i, root in enumerate(roots):
        alone = root is not None and not any(r is not None and r == root for j, r in enumerate(roots) if j != i)
        marked.append(alone and root in noalias)
    return marked


def mark_task_arguments(module: ir.Module) -> int:
    """Mark the buffers of each parallel body that its kernel calls with them (see the module's
    docstring: in every call; the loop calls it, and its guard for a single iteration); returns
    how many buffers were marked."""
    functions = {symbol(op): op for op in [op.operation for op in module.body.operations] if op.name == "func.func"}
    calls_by_task: dict[str, list[tuple[ir.Operation, ir.Operation]]] = {}
    for kernel in functions.values():
        if not symbol(kernel).startswith(BODY_PREFIX):
            for call in _task_calls(kernel):
                callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
                calls_by_task.setdefault(callee, []).append((call, kernel))
    count = 0
    for task, calls in calls_by_task.items():
        if len({kernel for _, kernel in calls}) != 1 or task not in functions:
            continue  # (each parallel loop gets a body of its own, called from its kernel only)
        noalias = _noalias_buffers(calls[0][1])
        marked = [all(marks) for marks in zip(*(_marked_parameters(call, noalias) for call, _ in calls))]
        if any(marked):
            positions = aligned_pointer_positions(list(calls[0][0].operands))
            functions[task].attributes[NOALIAS] = ir.DenseI64ArrayAttr.get(
                [p for p, mark in zip(positions, marked, strict=True) if mark and p is not None])
            count += sum(marked)
    return count
