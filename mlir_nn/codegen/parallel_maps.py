"""Large element-wise passes in row blocks on threads (after bufferization and update fusion).

An element-wise ``linalg.generic`` over a 2-D buffer (a product's epilogue, an optimizer's
update) runs as an ``scf.forall`` over blocks of PARALLEL_MAP_ROWS rows, or of more short rows
(PARALLEL_MAP_MIN elements), which the pipeline's thread pass spreads over threads. Over a
dynamic batch, the blocks are counted at run time: a batch of one block (the moons step's)
calls its body directly (``backends.parallel_bodies``), and a large one (24-48-48-24 at batch
20000) is spread. A short product (``short_products``) whose op(B) does not fit in half of L1
runs in tasks of columns instead, each task's slice of op(B) read from L2 once for all its rows
(``_column_tasks``).
Passes over tensors of rank 3 and more (layout transposes, bias and activation epilogues,
reductions over inner loops, copies and fills) are spread over their leading dim in blocks of
at least PARALLEL_MAP_MIN inner iterations (elements read: a row statistic reads its whole
row): on a 2-core machine such passes were about half of a CNN step's time, all of it on one
core. Passes that read windows (an im2col copy, pooling and its gradient) are spread too,
since compiled functions prefer no gathers and scatters (``backends.host_cpu``): before, LLVM
vectorized their tiled loops into them and a VGG step on one thread took 25% longer, so they
stayed serial (a fifth of a VGG-small step on one core).

Given the computing threads, a pass over a static leading dim is cut into at most one block a
thread (measured with the async lowering that preceded OpenMP's, which queued one task a block (on
2 threads it made 8 to 16 of the 8 to 32 blocks of each pass of the GPT steps: 1245 tasks a small
step in all, 3329 a medium one), and with blocks taken first come, first served a row read by one
pass may have been written by the pass before it on either core. With one block a thread, the
caller runs the first and a pool thread the next: 493 and 953 tasks; on two cores that share no
L3, the small step 17.0 -> 16.8 ms (medians of 4 interleaved fresh-process pairs at real-time
priority; fastest steps 16.3 -> 15.3), medium 76.7 -> 76.4 ms; interleaved with PyTorch eager
(``benchmarks/gpt_step.py``, 5 pairs) small 17.1 -> 16.7 ms (0.66x -> 0.65x eager)). The runtime gives
thread t the t-th contiguous range of blocks first in every loop (``backends/task_runtime.c``).

This runs after ``fuse_updates`` and ``hoist_scalars``, on the fused passes. Tiled on
tensors, before the pipeline's element-wise fusion, each op of an update chain became a loop
of its own that nothing could fuse any more: Adam's update of a 512 x 4096 weight was 13
threaded passes over memory, reading and writing 2M elements each, instead of one.
"""

from __future__ import annotations

import math
import re

from mlir import ir

from mlir_nn.codegen.row_pitch import aliased, copied_apart
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.support.cpu_target import data_cache_bytes

PARALLEL_MAP_ROWS, PARALLEL_MAP_MIN = 32, 1 << 14  # rows per task; elements per task from which it pays
COLUMN_STEP = 16  # a column task's width is a multiple of this many elements (whole vectors)
PARALLEL_MAP = "mlirnn.parallel_map"  # its value: the tile sizes of a task (rows of its leading dim first)
_THREADED = frozenset({"scf.forall", "scf.parallel"})
_SPREAD_OPS = frozenset({"linalg.generic", "linalg.copy", "linalg.fill"})  # (2-D fills: over a dynamic batch)
_SEQUENCE = """
module attributes {transform.with_named_sequence} {
  transform.named_sequence @spread(%root: !transform.any_op {transform.readonly}) {
BODY    transform.yield
  }
}
"""
_TILE = """    %maps_K = transform.structured.match ops{["linalg.generic", "linalg.copy", "linalg.fill"]}
        attributes {mlirnn.parallel_map = array<i64: SIZES>} in %root : (!transform.any_op) -> !transform.any_op
    %tiles_K, %forall_K = transform.structured.tile_using_forall %maps_K tile_sizes [SIZES]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
"""


def _inside_threads(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name in _THREADED:
            return True
        parent = parent.parent
    return False


def _leading_dim_splits(op: ir.Operation) -> bool:
    """Whether tiling loop 0 splits every output along its leading dim alone: loop 0 is
    parallel and each output map reads it as its first result and nowhere else."""
    if op.name != "linalg.generic":
        return True  # copies and fills: identity maps
    if "parallel" not in str(ir.ArrayAttr(op.attributes["iterator_types"])[0]):
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    lead = str(ir.AffineDimExpr.get(0))
    for out in maps[len(op.opview.inputs):]:
        results = [str(r) for r in out.results]
        if not results or results[0] != lead or any(lead in r for r in results[1:]):
            return False
    return True


def _loop_ranges(op: ir.Operation) -> list[int | None]:
    """Each loop's trip count of the generic ``op`` as its operands' static shapes give it
    (None: dynamic or not read as a plain dim)."""
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    ranges: list[int | None] = [None] * len(ir.ArrayAttr(op.attributes["iterator_types"]))
    for value, indexing in zip(op.operands, maps, strict=True):
        shape = ir.ShapedType(value.type).shape if isinstance(value.type, ir.ShapedType) else []
        for size, result in zip(shape, indexing.results, strict=False):
            if isinstance(result, ir.AffineDimExpr) and not ir.ShapedType.is_dynamic_size(size):
                ranges[ir.AffineDimExpr(result).position] = size
    return ranges


def _inner_split(op: ir.Operation) -> tuple[int, ...] | None:
    """Tile sizes that split a generic over a parallel loop other than its first, when loop 0
    cannot be split (a sum over the batch: a convolution's bias or few-tap weight gradient,
    per channel): the first parallel loop that each output reads as one plain dim and nowhere
    else, in tasks of at least PARALLEL_MAP_MIN iterations (a dynamic loop, the batch, counted
    as PARALLEL_MAP_ROWS, as 2-D passes over dynamic rows are spread), at least two tasks."""
    if op.name != "linalg.generic":
        return None
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    outputs = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])][len(op.opview.inputs):]
    ranges = _loop_ranges(op)
    for loop in range(1, len(iterators)):
        size = ranges[loop]
        if "parallel" not in iterators[loop] or size is None or not all(_reads_plainly(m, loop) for m in outputs):
            continue
        per_index = math.prod(r or PARALLEL_MAP_ROWS for r in ranges) // size
        count = -(-PARALLEL_MAP_MIN // per_index)
        if size > count:
            return (0,) * loop + (count,)
    return None


def _reads_plainly(indexing: ir.AffineMap, loop: int) -> bool:
    """Whether ``indexing`` has loop ``loop`` as one result of its own and in no other."""
    plain = [r for r in indexing.results if isinstance(r, ir.AffineDimExpr) and ir.AffineDimExpr(r).position == loop]
    mentions = [r for r in indexing.results if re.search(rf"\bd{loop}\b", str(r))]
    return len(plain) == 1 and len(mentions) == 1


def _row_reads(op: ir.Operation) -> list[ir.Value]:
    """The static matrices that the 2-D generic ``op`` reads one row of per term, at a constant
    index ((d0, d1) -> (kk, d1)): a short product's op(B) (``short_products``); none for other
    passes."""
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    read: list[ir.Value] = []
    for value, indexing in zip(op.opview.inputs, maps, strict=False):
        results = list(indexing.results)
        if (len(results) == 2 and isinstance(results[0], ir.AffineConstantExpr)
                and isinstance(results[1], ir.AffineDimExpr) and ir.AffineDimExpr(results[1]).position == 1
                and isinstance(value.type, ir.MemRefType) and ir.MemRefType(value.type).has_static_shape
                and all(value != other for other in read)):
            read.append(value)
    return read


def _column_tasks(op: ir.Operation, columns: int) -> int | None:
    """Columns per task of a short product over ``columns`` columns whose op(B) does not fit in
    half of L1, else None: in tasks of columns whose slices of op(B) do, each task reads its slice
    from L2 once for all rows; in tasks of rows every row read the whole of op(B) again (the
    10-4096-1 step's first layer at batch 100, 100x10 @ 10x4096 with bias and ReLU: 160 KB from L2
    a row, 343 of the step's 760 us on a Zen 3; 121 us in tasks of columns, op(B)'s rows copied
    apart first, ``row_pitch``)."""
    read = sum(math.prod(ir.MemRefType(v.type).shape) * ir.MemRefType(v.type).element_type.width // 8
               for v in _row_reads(op))
    budget = data_cache_bytes()[1] // 2
    if read <= budget:
        return None
    tasks = -(-read // budget)
    width = -(-columns // tasks // COLUMN_STEP) * COLUMN_STEP
    return width if width < columns else None


def _two_parallel_loops(op: ir.Operation) -> bool:
    """Whether the generic ``op`` has two loops, both parallel."""
    iterators = [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    return len(iterators) == 2 and all("parallel" in i for i in iterators)


def _row_reduction(op: ir.Operation) -> bool:
    """Whether ``op`` is a generic reducing each row of a 2-D buffer (a loss's row statistics
    over the classes: a parallel loop and a reduction) into outputs led by that row alone."""
    if op.name != "linalg.generic":
        return False
    iterators = ["parallel" in str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])]
    return iterators == [True, False] and _leading_dim_splits(op)


def _work_per_index(op: ir.Operation, per_row: int) -> int:
    """Inner iterations of ``op`` per index of its leading loop: the elements a generic reads
    for one (its reductions' extents times the ``per_row`` outputs it writes), at least those.
    Row statistics (32, 64, 64) -> (32, 64, 1) write 64 elements an index but read 4096: sized by
    their outputs they looked like one task's worth and ran serial between passes on threads."""
    ranges = _loop_ranges(op) if op.name == "linalg.generic" else []
    if not ranges or any(r is None for r in ranges[1:]):
        return per_row
    return max(per_row, math.prod(ranges[1:]))


def _task_rows(op: ir.Operation, threads: int | None = None) -> tuple[int, ...] | None:
    """Tile sizes of a task if ``op`` is a large pass to spread, else None: rows (indices of the
    leading dim), or (``_inner_split``) a count of another loop's indices. 2-D: an
    all-parallel generic or a copy (a product's last column panel) whose outputs have a
    static row length, in blocks of PARALLEL_MAP_ROWS rows (short rows: taller blocks of
    PARALLEL_MAP_MIN elements); a reduction of each row (``_row_reduction``) likewise, its
    rows counted by the elements read.
    Rank 3 and more: a generic (reductions over inner loops allowed), copy or fill with static
    inner dims, in blocks of at least PARALLEL_MAP_MIN inner iterations (``_work_per_index``),
    at least two of them. Never one tagged by another schedule or already on threads. A 2-D
    fill is spread only over a dynamic batch: zeroing a product's accumulator serially left
    every row the pool thread then added into in the other core's cache (on a 2-core VM whose
    cores share no L3: 16-64x7-1 at batch 4096, 10.1 -> 8.7 ms; 4.3 -> 3.9 ms where they share
    one). With ``threads``, blocks over a static leading dim hold at least 1 / threads of it."""
    if op.name not in _SPREAD_OPS or op.results or any(name.startswith("mlirnn.") for name in op.attributes):
        return None
    outs = list(op.operands)[len(op.opview.inputs):]
    if not outs or not all(isinstance(v.type, ir.MemRefType) for v in outs):
        return None
    shape = ir.MemRefType(outs[0].type).shape
    row_reduction = _row_reduction(op)
    if (len(shape) < 2 and not row_reduction) or any(ir.ShapedType.is_dynamic_size(d) for d in shape[1:]) or (
            _inside_threads(op)):
        return None
    per_row = math.prod(shape[1:])
    if row_reduction:
        rows = max(PARALLEL_MAP_ROWS, -(-PARALLEL_MAP_MIN // _work_per_index(op, per_row)))
    elif len(shape) == 2:
        if (op.name == "linalg.fill" and not ir.ShapedType.is_dynamic_size(shape[0])) or (
                op.name == "linalg.generic" and not _two_parallel_loops(op)):
            return None
        # short rows: taller blocks of PARALLEL_MAP_MIN elements. Over a dynamic batch the task
        # count is ceil(rows / block); a batch of one block's rows or fewer (the moons step's)
        # runs its one task on the calling thread, with no task started.
        rows = max(PARALLEL_MAP_ROWS, -(-PARALLEL_MAP_MIN // per_row))
        if op.name == "linalg.generic" and (width := _column_tasks(op, shape[1])) is not None:
            return 0, width
    elif _leading_dim_splits(op):
        rows = -(-PARALLEL_MAP_MIN // _work_per_index(op, per_row))
    else:
        return _inner_split(op)
    if threads is not None and not ir.ShapedType.is_dynamic_size(shape[0]):
        rows = max(rows, -(-shape[0] // threads))
    return (rows,) if ir.ShapedType.is_dynamic_size(shape[0]) or shape[0] > rows else None


def spread_maps(module: ir.Module, threads: int | None = None) -> int:
    """Put large passes of ``module`` (bufferized) on threads in blocks of tiles, with ``threads``
    (the computing threads) at most that many blocks over a static leading dim; how many."""
    with module.context:
        found = [(op, rows) for op in collect_ops(module, lambda op: op.name in _SPREAD_OPS)
                 if (rows := _task_rows(op, threads)) is not None]
        if not found:
            return 0
        for op, sizes in found:
            op.attributes[PARALLEL_MAP] = ir.DenseI64ArrayAttr.get(list(sizes))
            if sizes[0] == 0 and _two_parallel_loops(op):  # tasks of columns (``_column_tasks``)
                for value in _row_reads(op):
                    if aliased(value):
                        copied_apart(op, value)
        body = "".join(_TILE.replace("SIZES", ", ".join(map(str, sizes))).replace("_K", f"_{k}")
                       for k, sizes in enumerate(sorted({sizes for _, sizes in found})))
        schedule = ir.Module.parse(_SEQUENCE.replace("BODY", body))
        from mlir.dialects.transform import interpreter  # (only where maps go on threads)

        interpreter.apply_named_sequence(module.operation, schedule.body.operations[0], schedule)
    return len(found)
