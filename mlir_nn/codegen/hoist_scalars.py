"""Scalar work of element-wise generics computed once, before the loop (after bufferization).

An element-wise body often holds work that depends only on scalars: Adam's bias corrections
``1 - exp(t * log(beta))`` read the step count and the betas (0-d buffers) and are the same
for every element, yet the body computes them, with two ``exp`` calls, per element, and the
loads from 0-d buffers inside the loop keep LLVM from hoisting or vectorizing them. Here
each 0-d input such a body reads is loaded once right before the generic (where the
generic reads it), the scalar ops that depend only on those loads and on values from
outside move before the generic, and the body uses their results.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import memref

_PURE_PREFIXES = ("arith.", "math.")


def _scalar_inputs(op: ir.Operation) -> dict[ir.Value, ir.Value]:
    """Block arguments of ``op``'s body that stand for a whole 0-d input -> that input."""
    n_in = len(op.opview.inputs)
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    block = op.regions[0].blocks[0]
    return {
        block.arguments[i]: value
        for i, value in enumerate(list(op.operands)[:n_in])
        if isinstance(value.type, ir.MemRefType) and ir.MemRefType(value.type).rank == 0 and not maps[i].results
    }


def _hoist(op: ir.Operation) -> int:
    """Move the scalar work of one generic before it; the count of ops moved."""
    scalars = _scalar_inputs(op)
    block = op.regions[0].blocks[0]
    inside = set(block.arguments)
    for inner in block.operations:
        inside.update(inner.results)
    hoisted: list[ir.Operation] = []
    invariant = set(scalars)
    for inner in block.operations:  # decided before anything moves (an erased value's identity may be reused)
        if (
            inner.name.startswith(_PURE_PREFIXES)
            and not inner.regions
            and len(inner.results) == 1
            and all(v in invariant or v not in inside for v in inner.operands)
        ):
            hoisted.append(inner)
            invariant.add(inner.results[0])
    before: dict[ir.Value, ir.Value] = {}  # a value of the body -> its value before the generic
    with op.context, op.location, ir.InsertionPoint(op):
        for inner in hoisted:
            for v in inner.operands:
                if v in scalars and v not in before:
                    before[v] = memref.load(scalars[v], [])
            copy = inner.clone()
            for i, v in enumerate(list(copy.operands)):
                if v in before:
                    copy.operands[i] = before[v]
            before[inner.results[0]] = copy.results[0]
    for inner in hoisted:
        inner.results[0].replace_all_uses_with(before[inner.results[0]])
    for inner in reversed(hoisted):
        inner.erase()
    return len(hoisted)


def hoist_scalar_work(module: ir.Module) -> int:
    """Hoist the scalar work of the parallel generics in the functions' top-level blocks; the count moved."""
    moved = 0
    for fn in module.body.operations:
        if fn.operation.name != "func.func" or not fn.regions[0].blocks:
            continue
        for op in list(fn.regions[0].blocks[0].operations):
            if op.name != "linalg.generic" or op.results:
                continue
            kinds = [str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"])]
            if kinds and all("parallel" in k for k in kinds):
                moved += _hoist(op)
    return moved
