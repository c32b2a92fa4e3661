"""Vector loads that are only split into lanes become scalar loads (LLVM dialect).

The matmul register kernel broadcasts each element of a packed A panel's tm-wide row:
``vector.outerproduct`` lowers to one vector load of the row and an ``extractelement``
plus splat per lane. For a lane count that is not a power of two (tm = 6 with AVX2),
LLVM folds only the lanes of the leading power-of-two part into broadcasts from memory;
the rest become a narrow load, shuffles and broadcasts from a register, which compete
with the FMAs for the vector ports (measured with AVX2 on Zen 3: a 6x16 kernel unrolled
by 4 ran at 72 GFLOP/s with them, 89 with memory broadcasts only). Loading each lane as
its own scalar lets every splat become one ``vbroadcastss`` from memory, a pure load.
Loads of power-of-two lane counts are left to LLVM, which already folds them.
"""

from __future__ import annotations

from mlir import ir

from mlir_nn.codegen.walk import collect_ops


def _constant_lane(op: ir.Operation) -> int | None:
    """The lane an ``llvm.extractelement`` reads, when it is a constant."""
    if op.name != "llvm.extractelement":
        return None
    source = op.operands[1].owner
    if isinstance(source, ir.Block) or source.name != "llvm.mlir.constant":
        return None
    return ir.IntegerAttr(source.attributes["value"]).value


def _lane_reads(load: ir.Operation) -> list[tuple[ir.Operation, int]] | None:
    """(extractelement, lane) for every use of ``load``'s vector, or None if some use is not one."""
    reads = []
    for use in load.results[0].uses:
        lane = _constant_lane(use.owner) if use.operand_number == 0 else None
        if lane is None:
            return None
        reads.append((use.owner, lane))
    return reads or None


def _is_odd_vector_load(op: ir.Operation) -> bool:
    """A plain (not volatile, nontemporal or atomic) load of a 1-D float vector whose lane
    count is not a power of two."""
    if op.name != "llvm.load" or not isinstance(op.results[0].type, ir.VectorType):
        return False
    kind = ir.VectorType(op.results[0].type)
    lanes = kind.shape[0] if kind.rank == 1 and isinstance(kind.element_type, ir.FloatType) else 0
    plain = (not any(name in op.attributes for name in ("volatile_", "nontemporal"))
             and ("ordering" not in op.attributes or ir.IntegerAttr(op.attributes["ordering"]).value == 0))
    return plain and lanes > 1 and lanes & (lanes - 1) != 0


def scalarize_lane_loads(module: ir.Module) -> int:
    """Rewrite each load that ``_is_odd_vector_load`` accepts and whose every use extracts a
    constant lane into one scalar load per lane used; how many loads were rewritten."""
    candidates = [(op, _lane_reads(op)) for op in collect_ops(module, _is_odd_vector_load)]
    loads = [(op, reads) for op, reads in candidates if reads is not None]
    with module.context:
        for load, reads in loads:
            element = ir.VectorType(load.results[0].type).element_type
            alignment = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), ir.FloatType(element).width // 8)
            scalars: dict[int, ir.Value] = {}
            with ir.InsertionPoint(load):
                for extract, lane in sorted(reads, key=lambda read: read[1]):
                    if lane not in scalars:
                        pointer = ir.Operation.create(
                            "llvm.getelementptr", results=[load.operands[0].type], operands=[load.operands[0]],
                            attributes={"rawConstantIndices": ir.DenseI32ArrayAttr.get([lane]),
                                        "elem_type": ir.TypeAttr.get(element)}, loc=load.location)
                        scalars[lane] = ir.Operation.create("llvm.load", results=[element], operands=[pointer.result],
                                                            attributes={"alignment": alignment},
                                                            loc=load.location).result
                    extract.result.replace_all_uses_with(scalars[lane])
                    extract.erase()
            load.erase()
    return len(loads)
