"""Strided buffer copies as loops the compiler can vectorize.

Bufferization and ``buffer-results-to-out-params`` copy buffers with ``memref.copy``. A
copy between contiguous buffers becomes a memcpy; one with a strided side (a view of a
product's padded accumulator, for instance) would call MLIR's generic runtime copy, which
moves one element per call of ``memcpy``. Those become ``linalg.copy`` loops instead.
"""

from __future__ import annotations

from mlir import ir

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.walk import collect_ops


def _plain(kind: ir.MemRefType) -> bool:
    """True for the identity layout (a dense row-major buffer)."""
    return isinstance(kind.layout, ir.AffineMapAttr) and kind.layout.value == ir.AffineMap.get_identity(kind.rank)


def strided_copies_as_loops(module: ir.Module) -> None:
    """Replace every ``memref.copy`` with a strided side by ``linalg.copy``."""
    copies = collect_ops(module, lambda op: op.name == "memref.copy")
    with module.context:
        for op in copies:
            source, target = op.operands
            if all(_plain(ir.MemRefType(v.type)) for v in (source, target)):
                continue
            with ir.InsertionPoint(op), op.location:
                linalg.copy(source, outs=[target])
            op.erase()
