"""A product's partial sums added over the first partial, not into a copy of it (after bufferization).

A weight gradient summed in ranges of the batch (``cpu_matmul._summed_in_tasks``) adds the other
partials to the first (tagged ``PARTIALS_SUM``). Bufferization gives that sum a buffer of its own
and copies the first partial into it, since the sum reads the others from the same buffer: a copy
of C per product and step, below the switch too, where there are no others (a 100-wide MLP at
batch 128: three copies of 45 KB a step). The partials' slots are disjoint, so the sum writes over
the first: the readers of the copy read the first partial's view, and the copy goes.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

from mlir_nn.codegen.cpu_matmul import PARTIALS_SUM
from mlir_nn.codegen.walk import collect_linalg_ops


def _slot(view: ir.Value) -> tuple[ir.Value, int, int] | None:
    """(the buffer, first slot, slots) of a ``memref.subview`` along its dim 0 (-1 slots: dynamic)."""
    owner = view.owner
    if not isinstance(owner, ir.OpView | ir.Operation) or owner.name != "memref.subview":
        return None
    offsets = list(ir.DenseI64ArrayAttr(owner.attributes["static_offsets"]))
    sizes = list(ir.DenseI64ArrayAttr(owner.attributes["static_sizes"]))
    if any(offset != 0 for offset in offsets[1:]) or offsets[0] == ir.ShapedType.get_dynamic_size():
        return None
    return owner.operands[0], offsets[0], sizes[0] if sizes[0] != ir.ShapedType.get_dynamic_size() else -1


def _top(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The ancestor of ``op`` (itself included) in ``block``, or None."""
    while op is not None and op.block != block:
        parent = op.parent
        op = parent.operation if parent is not None and parent.name != "builtin.module" else None
    return op


def sum_over_first_partials(module: ir.Module) -> int:
    """Rewrite each ``PARTIALS_SUM`` sum whose output is a buffer filled by a copy of the first
    partial (slot 0 of the buffer whose later slots it reads) to write over that partial; how many."""
    count = 0
    for op in collect_linalg_ops(module, lambda o: PARTIALS_SUM in o.attributes):
        out = op.operands[len(op.opview.inputs)]
        alloc = out.owner
        if not isinstance(alloc, ir.OpView | ir.Operation) or alloc.name != "memref.alloc":
            continue
        copies = [use.owner for use in out.uses if use.owner.name == "memref.copy" and use.operand_number == 1]
        if len(copies) != 1:
            continue
        copy = copies[0].operation
        first, others = _slot(copy.operands[0]), _slot(op.operands[0])
        if first is None or others is None or first[0] != others[0] or first[1:] != (0, 1) or others[1] < 1:
            continue
        block = op.operation.block
        order = {o: i for i, o in enumerate(o.operation for o in block.operations)}
        readers = [_top(use.owner.operation, block) for use in out.uses]
        if copy.block != block or any(r is None for r in readers) or \
                any(order[r] < order[op.operation] for r in readers if r not in (copy, op.operation)) or \
                order[copy] > order[op.operation]:
            continue
        with ir.InsertionPoint(copy), copy.location:
            over = memref.cast(out.type, copy.operands[0])
        out.replace_all_uses_except(over, copy)
        copy.erase()
        alloc.operation.erase()
        count += 1
    return count
