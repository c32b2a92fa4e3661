"""Blocked products start their register accumulators at zero instead of zero-filling a buffer.

After the CPU matmul schedule, a blocked product's accumulator (the tasks' shared output when
on threads) is a ``linalg.fill`` with 0 (tagged ``mlirnn.acc_init``) that the kc-slice loop
(``mlirnn.kc_loop``) starts from: a pass over the whole accumulator before any product
work, and a read of those zeros by every register block of the first slice. Every register
block is read and then written once per slice (the padding makes all blocks whole), so the
first slice can start its blocks from zero registers, later slices from what the previous
one wrote, and the fill can go: its buffer is only ever written before it is read. When k
fits one slice, canonicalization has folded the slice loop away and every read is of the
fill, so every block starts from zero.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from mlir_nn.codegen.walk import collect_linalg_ops

ACC_INIT, KC_LOOP = "mlirnn.acc_init", "mlirnn.kc_loop"
FOR_INITS = 3  # scf.for operands: lower bound, upper bound, step, then the iter_args' inits


def _block_reads(value: ir.Value) -> list[ir.Operation] | None:
    """The ``vector.transfer_read`` ops that read blocks of ``value`` before anything is
    written into it, following slices and loop-carried values; None if ``value`` has a use
    this does not understand (then nothing may change)."""
    reads: list[ir.Operation] = []
    for use in value.uses:
        op, position = use.owner, use.operand_number
        if op.name == "tensor.extract_slice" and position == 0:
            found = _block_reads(op.results[0])
        elif op.name == "scf.for" and position >= FOR_INITS:
            found = _block_reads(op.regions[0].blocks[0].arguments[1 + position - FOR_INITS])
        elif op.name == "scf.forall" and position >= len(op.operands) - len(op.results):
            # a shared output of tasks: each task's tile of it is its block argument
            arguments = op.regions[0].blocks[0].arguments
            found = _block_reads(arguments[len(arguments) - len(op.operands) + position])
        elif op.name == "vector.transfer_read" and position == 0:
            found = [op]
        elif (op.name in ("tensor.insert_slice", "tensor.parallel_insert_slice") and position == 1) or (
                op.name == "vector.transfer_write" and position == 1):
            found = []  # written into: what it yields holds products, not zeros
        else:
            return None
        if found is None:
            return None
        reads += found
    return reads


def _kc_loop(op: ir.Operation) -> ir.Operation | None:
    """The kc-slice loop around ``op``, if there is one (folded away when k fits one slice)."""
    parent = op.parent
    while parent is not None and not (parent.name == "scf.for" and KC_LOOP in parent.attributes):
        parent = parent.parent
    return parent


def _zero_from(read: ir.Operation, first: ir.Value | None) -> None:
    """Make ``read`` yield zeros (in the first slice only, when ``first`` is given)."""
    kind = ir.VectorType(read.results[0].type)
    with ir.InsertionPoint(read), read.location:
        zeros = arith.constant(kind, ir.DenseElementsAttr.get_splat(kind, ir.FloatAttr.get(kind.element_type, 0.0)))
    if first is None:
        read.results[0].replace_all_uses_with(zeros)
        read.erase()
        return
    uses = list(read.results[0].uses)
    with ir.InsertionPoint.after(read), read.location:
        chosen = arith.select(first, zeros, read.results[0])
    for use in uses:
        use.owner.operands[use.operand_number] = chosen


def _first_slice(loop: ir.Operation | None, firsts: dict[ir.Operation, ir.Value]) -> ir.Value | None:
    """The condition "first iteration of ``loop``", made once per loop at its body's start."""
    if loop is None:
        return None
    if loop not in firsts:
        body = loop.regions[0].blocks[0]
        with ir.InsertionPoint.at_block_begin(body), loop.location:
            firsts[loop] = arith.cmpi(arith.CmpIPredicate.eq, body.arguments[0], loop.operands[0])
    return firsts[loop]


def start_accumulators_at_zero(module: ir.Module) -> int:
    """Drop the zero fill of each blocked product's accumulator (see the module docstring);
    how many fills were dropped."""
    fills = collect_linalg_ops(module, lambda op: op.name == "linalg.fill" and ACC_INIT in op.attributes)
    firsts: dict[ir.Operation, ir.Value] = {}  # per kc loop: "this is its first slice"
    dropped = 0
    with module.context:
        for fill in fills:
            reads = _block_reads(fill.results[0])
            if reads is None:
                continue
            for read in reads:
                _zero_from(read, _first_slice(_kc_loop(read), firsts))
            fill.results[0].replace_all_uses_with(fill.operands[1])
            fill.erase()
            dropped += 1
    return dropped
