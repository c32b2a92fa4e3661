"""Large element-wise passes in row blocks on threads (after bufferization and update fusion).

An element-wise ``linalg.generic`` over a buffer with at least PARALLEL_MAP_MIN elements per
block of PARALLEL_MAP_ROWS rows (a product's epilogue, an optimizer's update) runs as an
``scf.forall`` over blocks of rows, which the pipeline's async lowering spreads over threads.

This runs after ``fuse_updates`` and ``hoist_scalars``, on the fused passes. Tiled on
tensors, before the pipeline's element-wise fusion, each op of an update chain became a loop
of its own that nothing could fuse any more: Adam's update of a 512 x 4096 weight was 13
threaded passes over memory, reading and writing 2M elements each, instead of one.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects.transform import interpreter

from mlir_nn.codegen.walk import collect_ops

PARALLEL_MAP_ROWS, PARALLEL_MAP_MIN = 32, 1 << 14  # rows per task; elements per task from which it pays
PARALLEL_MAP = "mlirnn.parallel_map"
_THREADED = frozenset({"scf.forall", "scf.parallel"})
_SCHEDULE = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @spread(%root: !transform.any_op {transform.readonly}) {
    %maps = transform.structured.match ops{["linalg.generic"]} attributes {mlirnn.parallel_map} in %root
        : (!transform.any_op) -> !transform.any_op
    %rows, %forall = transform.structured.tile_using_forall %maps tile_sizes [ROWS]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.yield
  }
}
"""


def _inside_threads(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name in _THREADED:
            return True
        parent = parent.parent
    return False


def _is_large_map(op: ir.Operation) -> bool:
    """An untagged all-parallel 2-D generic over buffers, not already on threads, whose
    outputs have a static row length and at least PARALLEL_MAP_MIN elements per block of
    PARALLEL_MAP_ROWS rows."""
    if op.name != "linalg.generic" or op.results or any(name.startswith("mlirnn.") for name in op.attributes):
        return False
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    if len(iterators) != 2 or any("parallel" not in i for i in iterators):
        return False
    outs = list(op.operands)[len(op.opview.inputs):]
    if not outs or not all(isinstance(v.type, ir.MemRefType) for v in outs):
        return False
    rows, cols = ir.MemRefType(outs[0].type).shape
    return (not ir.ShapedType.is_dynamic_size(cols) and PARALLEL_MAP_ROWS * cols >= PARALLEL_MAP_MIN
            and (ir.ShapedType.is_dynamic_size(rows) or rows > PARALLEL_MAP_ROWS) and not _inside_threads(op))


def spread_maps(module: ir.Module) -> int:
    """Put large element-wise passes of ``module`` (bufferized) on threads in row blocks; how many."""
    with module.context:
        found = collect_ops(module, _is_large_map)
        if not found:
            return 0
        for op in found:
            op.attributes[PARALLEL_MAP] = ir.UnitAttr.get()
        schedule = ir.Module.parse(_SCHEDULE.replace("ROWS", str(PARALLEL_MAP_ROWS)))
        interpreter.apply_named_sequence(module.operation, schedule.body.operations[0], schedule)
    return len(found)
