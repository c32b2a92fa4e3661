"""Rows of a short product's op(B) copied apart, so that a column task's slices of them share L1 (bufferized).

A short product (``short_products``) in tasks of columns (``parallel_maps``) keeps each task's
slice of op(B)'s k rows in L1 for all rows of the batch. Rows whose pitch is a multiple of
ALIASED_PITCH bytes put their j-th elements into the same few sets of an 8-way L1: more than
eight rows and the output row evicted each other's lines, so every row of the batch read the
slices from L2 again (10x4096 float32: the 100x10 @ 10x4096 layer with bias and ReLU ran in
221 us where a 10x4000 one took 98, one core pair of a Zen 3). Such an operand is copied once a
step into rows PADDING bytes longer, read through a view of its (k, n) corner; a buffer the step
made for it (the transposed copy of op(B) stored (n, k)) is allocated with the longer rows instead.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

from mlir_nn.codegen import linalg_ops as linalg

ALIASED_PITCH = 1024  # row pitches (bytes) that a multiple of puts every row's j-th element in the same sets
PADDING = 64  # bytes added to each copied row: one cache line, so consecutive rows fall in consecutive sets


def aliased(value: ir.Value) -> bool:
    """Whether ``value`` is a static 2-D memref of more than one row, each a multiple of
    ALIASED_PITCH bytes from the next."""
    if not isinstance(value.type, ir.MemRefType):
        return False
    kind = ir.MemRefType(value.type)
    if kind.rank != 2 or not kind.has_static_shape or kind.shape[0] < 2:
        return False
    strides, _ = kind.get_strides_and_offset()
    return strides[1] == 1 and strides[0] * kind.element_type.width // 8 % ALIASED_PITCH == 0


def _fresh(value: ir.Value) -> bool:
    """Whether ``value`` is a static ``memref.alloc`` that only linalg ops use (a copy the step
    made, as the (k, n) rows of a transposed op(B)): it can be allocated with longer rows itself."""
    owner = value.owner
    return (isinstance(owner, ir.Operation | ir.OpView) and owner.name == "memref.alloc"
            and not list(owner.operands) and all(use.owner.name.startswith("linalg.") for use in value.uses))


def copied_apart(op: ir.Operation, value: ir.Value) -> None:
    """Make ``op`` read ``value`` (``aliased``; at every operand it is) from rows PADDING bytes
    longer: a ``_fresh`` buffer is allocated so in place (whoever writes it writes the longer rows),
    anything else is copied into such rows right before ``op``."""
    kind = ir.MemRefType(value.type)
    rows, columns = kind.shape
    pitch = columns + PADDING * 8 // kind.element_type.width
    fresh = _fresh(value)
    with ir.InsertionPoint(value.owner if fresh else op), (value.owner if fresh else op).location:
        padded = memref.alloc(ir.MemRefType.get([rows, pitch], kind.element_type), [], [])
        corner = memref.subview(padded, [0, 0], [rows, columns], [1, 1], result_type=ir.MemRefType.get(
            [rows, columns], kind.element_type, ir.StridedLayoutAttr.get(0, [pitch, 1])))
        if not fresh:
            linalg.copy(value, outs=[corner])
    if fresh:
        alloc = value.owner
        value.replace_all_uses_with(corner)
        alloc.erase()
        return
    for position, operand in enumerate(op.operands):
        if operand == value:
            op.operands[position] = corner
