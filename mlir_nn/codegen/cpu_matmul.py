"""CPU code for matrix products: GotoBLAS-style blocked kernels for large ones, loops for small ones.

``linalg.matmul`` ops are rewritten before the CPU pipeline runs. Where several schedules are
legal for a product (blocked or loops, swapped or not, vector rows or blocked, threads or not),
the cheapest by the estimates of ``schedule_costs`` is taken, from the table of rates measured
on the host (``schedule_rates``; ``product_plan`` is the one place that decides):

* a large product (static column count, enough static work, a zero-filled accumulator)
  packs op(A) into row panels [m / tm, k, tm] and op(B) into column panels
  [n / tn, k, tn] (whole panels copied straight from the operand, a partial last panel
  zero-padded; a transposed operand is transposed by its packing, no separate copy) and
  becomes a ``linalg.generic`` over (column panel, row panel, row, column, k) into a
  zero-filled [m / tm, tm, n / tn, tn] accumulator whose (m, n) corner is the result (a
  view). Static operands whose rows split into whole blocks are read in place instead of
  packed (views [m / tm, tm, k] of A, [k, m / tm, tm] of a transposed A, [k, n / tn, tn] of
  B): in GPT small's step over a static batch of 2048 rows, packing took about 14% of one core's time.
  The transform schedule ``passes/cpu_matmul.mlir`` splits it into tasks over threads
  (2-D: column and row panels), kc-deep slices of k, and tm x tn register blocks vectorized
  to broadcasts and FMAs; after it, the register blocks of the first slice start from zero
  instead of the zero fill (``zero_start``). Block sizes come from the host
  (``mlir_nn.support.cpu_target``). Its epilogue (bias + ReLU, ReLU-grad mask, folded
  update) reads the corner and writes a fresh tensor, or the updated parameter in place.
  A product with fewer columns than a register block's (a 10-class output layer: 10 of 32
  columns with AVX-512) runs swapped, C^T = op(B)^T op(A)^T with all its rows in one
  register block, and is transposed back (``_swapping``), unless it is static with at most
  SWAPPED_LOOP_MAX work (a batched product's 64x16x64): that one is a small product;
* a static product with at most ROW_BLOCK_WORK_MAX work that is one matrix of a batch loop
  (attention's, ``batched_products``) runs in register blocks of rows (``row_blocks``), when
  its sizes allow;
* a large product, or one whose rows are the batch, with a short static k is one
  element-wise pass merged with its epilogue (``short_products``);
* a small product becomes a ``linalg.generic`` in the loop order whose innermost loop
  runs over contiguous memory: (k, m, n) when A is transposed and B is not (row
  updates of C), (m, k, n) when B is (k, n) (a row update, which LLVM vectorizes),
  (m, n, k) when B is transposed or rows are short (a dot product whose sum is marked
  ``reassoc`` so LLVM vectorizes the reduction). When its two inner loops have static
  sizes it is vector code: a static B stored transposed is copied to (k, n) first, so
  that the order is (m, k, n) (per k, a broadcast of A[i, k] times the row B[k, :]; read as
  (n, k), every row's contraction was lowered to shuffles of B's columns). With a static
  outer loop (``mlirnn.small_vector``) the schedule vectorizes it one iteration at a time.
  Over a dynamic batch (``mlirnn.small_rows``, the narrow layers of a large batch) it runs
  in blocks of SMALL_ROW_BLOCK rows (``small_block_rows``), one contraction each (each row of
  B feeds that many independent FMA chains; a weight gradient's accumulator is loaded and
  stored once per block), the last partial block row by row; in the (m, k, n) order each block loops over
  k in steps of SMALL_K_STEP (``mlirnn.small_k_steps``), not unrolled over the whole of k;
  a sum over the batch whose accumulator has more than SMALL_CARRY_MAX elements (it is
  carried through the batch loop) is split into chunks of its rows: a loop over equal chunks
  (``mlirnn.small_chunk``) when a divisor of the rows makes them large enough, else one
  product each (``_in_chunks``), and into partial sums of batch ranges on threads when the
  batch is large (``batch_split``); when the batch is the rows, in tasks of rows on threads
  (``mlirnn.small_tasks``), as many as the batch needs at run time. The moons MLP's step at
  batch 10000 went from 7.5 to 1 ms on one core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, bufferization, scf, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.batch_split import TASKS_MAX, partials_added, rows_per_task, sum_over_batch
from mlir_nn.codegen.gemm_calls import library_product
from mlir_nn.codegen.im2col_panels import (
    drop_im2col_tags,
    im2col_panels,
    im2col_source,
    padded_columns,
    panel_rows,
    pixel_panels,
)
from mlir_nn.codegen.maps import dims_map, matmul_maps
from mlir_nn.codegen.parameter_updates import Update, copy_times_factor, parameter_update, scaled
from mlir_nn.codegen.row_blocks import K_STEP as ROW_BLOCK_K_STEP
from mlir_nn.codegen.row_blocks import block_rows, row_block_product
from mlir_nn.codegen.row_pitch import ALIASED_PITCH
from mlir_nn.codegen.row_sums import tag_row_sums
from mlir_nn.codegen.schedule_costs import (
    BATCH_ROWS_ESTIMATE,
    Estimate,
    batch_sums_rate,
    blocked_or_loops,
    compared,
    on_threads,
    per_batch_row,
    swapped_or_not,
    vector_rows_rate,
)
from mlir_nn.codegen.shaped import dim_sizes, matmul_transposes, transposed, updated_input
from mlir_nn.codegen.short_products import SHORT_K, fuse_into_epilogue, short_product
from mlir_nn.codegen.walk import collect_linalg_ops, in_tasks
from mlir_nn.codegen.zero_start import ACC_INIT, start_accumulators_at_zero
from mlir_nn.support.cpu_target import (
    cache_blocks,
    data_cache_bytes,
    deep_kc,
    in_place_kc,
    register_block,
    vector_bytes,
)
from mlir_nn.support.pipelines import shipped_dir
from mlir_nn.support.schedule_rates import ScheduleRates, active

PARALLEL = linalg.IteratorType.parallel
REDUCTION = linalg.IteratorType.reduction
ROW_MIN = 64  # shorter rows keep the dot-product loop order
NARROW_SAVING_MIN = 0.03  # share of n that blocks one register wide must save in padding (``block_columns``)
# Independent FMA chains a register block needs to keep both FMA pipes busy (latency 4 x 2 pipes on
# Zen 3-5): blocks one register wide have a chain per row, so they need this many rows
NARROW_ROWS_MIN = 8
# A static product that would be swapped with at most this much work (attention's 64x16x64 per head)
# runs as a vector loop instead: packing both operands cost more than the product. GPT small step on
# one core: 31.4 -> 29.8 ms.
SWAPPED_LOOP_MAX = 1 << 16
# A static product of a batch loop with at most this much work runs in register blocks of rows
# (``row_blocks``): attention's per-head products at head widths 16 and 32.
ROW_BLOCK_WORK_MAX = 1 << 17
# Operands of static products read in place rather than packed (``_rows_in_place``,
# ``_columns_in_place``): rows at most this many bytes apart. One core: a kc-deep slice of rows
# 4 KB apart falls on few L1 sets (1024x1024x1024 weight gradient 23.2 -> 25.2 ms); 2 KB apart
# still pays (GPT medium's 512x2048x128 weight gradient 2.98 ms packed, 2.54 ms in place).
IN_PLACE_STRIDE_MAX = 2048
# Over a dynamic k, an operand read in place in blocks of fewer rows than a register block's when
# the product has at most this many columns: packing costs about one copy per n multiply-adds, the
# shorter blocks some FMA density (one process alternating both builds, one core: 100-wide Adam
# step at batch 5000 -6.6% in blocks of 10 rows, 64-wide layers -4%; 512 columns +1 to +2.5% in
# blocks of 8). On two threads, 256 columns in blocks of 4 rows lost to packing (one process
# alternating both builds: 256-256-256-10 float64 at batch 1024 0.86x and 4096 0.87x packed, float32
# 0.95x, 64-256-256-64 Adam at batch 1000 0.91x; 64 and 100 columns even)
IN_PLACE_SHORT_COLUMNS_MAX = 128
PADDED_ROWS = "mlirnn.padded_rows"  # a buffer of whole row panels that a product reads in place: its number
SCHEDULE = "cpu_matmul.mlir"
# Tags the schedule matches: the blocked product, its accumulator's zero fill, packings
# of the operands (copies of whole vector rows, copies in TRANSPOSE_TILE-deep vector
# tiles when the packing transposes and the sizes allow, else loops), and ops with
# enough work to spread over threads.
PACKED, PARALLEL_ROWS = "mlirnn.packed", "mlirnn.parallel"
# the depth of a packed product's kc slices (``_slice_depth``: deeper where a task sweeps few rows of A)
KC_DEPTH = "mlirnn.kc"
# tasks of SWAPPED_TASK_PANELS column panels only: a swapped product on threads, or one over a
# batch of fewer rows than its columns (``_column_tasks``)
PARALLEL_COLUMNS = "mlirnn.parallel_columns"
# A product on threads whose columns are one task's (n <= nc): tasks of a quarter of the default
# row panels, so that the last, partial task leaves the other cores little to wait for (128-512x3-1
# at batch 256, two cores: 22 row panels ran as tasks of 16 and 6; 6.2-7.4 -> 5.1-5.2 ms per step)
PARALLEL_FINE, FINE_TASK_SHARE = "mlirnn.parallel_fine", 4
# a product with static rows whose default tasks are few or uneven: tasks of the given
# (column panels, row panels), ``balanced_tasks``
PARALLEL_TASKS = "mlirnn.parallel_tasks"
BALANCED_TASKS_MIN = 4  # tasks a product with static rows is split into, when its panels allow
SWAPPED_TASK_PANELS = 4  # column panels per task of a swapped product (its one row panel is small)
PACK, PACK_TILES, PACK_SQUARES = "mlirnn.pack", "mlirnn.pack_tiles", "mlirnn.pack_squares"
PACK_ROWS_A, PACK_ROWS_B = "mlirnn.pack_rows_a", "mlirnn.pack_rows_b"  # row copies into A's / B's panels
PACK_ROWS_B_NARROW = "mlirnn.pack_rows_b_narrow"  # the same into one-register panels (``block_columns``)
PACK_ROW_GROUPS = "mlirnn.pack_row_groups"  # row copies in static groups of PACK_ROWS_STEP rows
PACK_PARALLEL, TRANSPOSE_TILE, PACK_ROWS_STEP = "mlirnn.pack_parallel", 16, 8
# Row copies into at most PACK_TASK_PANELS panels (tasks of that many panels would be one) spread
# over their rows instead, in tasks of PACK_TASK_ROWS (a weight gradient's k: a static batch;
# vectorized with masks, so a partial last task is fine)
PACK_PARALLEL_ROWS, PACK_TASK_PANELS, PACK_TASK_ROWS = "mlirnn.pack_parallel_rows", 4, 256
# A weight gradient op(A)^T B summed over a dynamic batch whose C has at most K_RANGES_OUTPUT_MAX
# elements runs as one task loop (``_summed_in_tasks``) whose tasks are chosen at run time: from a
# batch of K_RANGES_ROWS_PER_OUTPUT * 2mn / (m + n) rows, ranges of the batch, each into a partial
# C of its own (each thread then sums the rows it packed: tasks of tiles of C read every row, the
# other core's half across the two cores' caches when they share no L3, a cost that grows with
# the batch, where the partials' grows with m * n); below, the tiles of C of the tagged product.
K_RANGES_OUTPUT_MAX, K_RANGES_ROWS_PER_OUTPUT = 1 << 16, 4
# the partials' bytes at most (2 to TASKS_MAX of them): 8 partials of a 256 x 256 weight gradient
# (2 MB in float32, 4 MB in float64), zeroed, written and summed at batch 1024, made a
# 256-256-256-10 float64 step 5% slower than C's tiles (two: as fast, -8% at 64-256-256-64 Adam)
K_RANGES_PARTIALS_BYTES = 1 << 19
# the sum of the other partials into the first: one pass on the calling thread (spread over tasks,
# its tasks ran with no work below K_RANGES_ROWS_PER_OUTPUT's batch, a round trip to the pool per
# weight gradient)
PARTIALS_SUM = "mlirnn.partials_sum"
_DYNAMIC = ir.ShapedType.get_dynamic_size()
# A batch's rows copied in groups (``_pack_row_groups``) spread over the groups, one block of them
# a computing thread when their count is known (the passes before split the batch's rows the same
# way: each thread copies the rows it wrote itself), else in tasks of PACK_TASK_ROWS rows. Tasks of
# 256 rows left a batch of 256 one task: 128-512-512-512-1 SGD at batch 256 was 2-3% slower on two
# cores that share an L3, 4-5% on two that do not (one process alternating both builds)
PACK_PARALLEL_GROUPS = "mlirnn.pack_parallel_groups"
# Small products whose inner two loops have static sizes: vector code per outer iteration.
SMALL_VECTOR = "mlirnn.small_vector"
# Those over a dynamic batch: in blocks of rows (the tag's value: rows per block), SMALL_ROW_BLOCK,
# or NARROW_ROW_BLOCK in the (m, k, n) order where C's rows are NARROW_ROW_VECTORS vector registers
# or fewer and there are 32 of them: two 512-bit FMA units of 4 cycles' latency (Intel's, Zen 5's)
# need 8 chains in flight, and a row of one register (or the one-register part of a split row:
# 48 = 32 + 16) in blocks of 4 has 4. Two cores of an Intel Xeon (family 6 model 207): the 1000 x 10
# forward product at batch 10000 1369 -> 994 us; at batch 20000, 48 x 48 294 -> 249 us, 48 x 24
# 315 -> 218. Wider rows (64 floats: 32 accumulators in blocks of 8) keep blocks of 4.
SMALL_ROWS, SMALL_ROW_BLOCK, NARROW_ROW_BLOCK, NARROW_ROW_VECTORS = "mlirnn.small_rows", 4, 8, 3
# Those in the (m, k, n) order whose k is a multiple of SMALL_K_STEP (and longer): a loop over
# k in steps of that many, the block's accumulators carried in registers. Unrolled whole, the
# k = 256 forward product of a 256-10 output layer (1280 FMAs) took LLVM about a second.
SMALL_K_STEPS, SMALL_K_STEP = "mlirnn.small_k_steps", 8
# Register kernels per iteration of a blocked product's k loop (the schedule's unroll factor).
K_UNROLL = 4
# The quick tier's schedule (``quick``, code for LLVM at -O0, which schedules nothing): the k loop
# not unrolled and small products in k steps of QUICK_SMALL_K_STEP. Traced Adam MLPs at batch 128,
# one thread, fresh processes alternated, medians of 3, load 2.2: 4x256 LLVM input 25.8k -> 17.7k
# lines, compile 1.15 -> 0.91 s (passes 0.42 -> 0.31, LLVM 0.52 -> 0.39), step 2.90 -> 2.93 ms
# (interpreter: 3.9); 8x64 22.9k -> 18.0k lines, 1.34 -> 1.19 s, step 0.501 -> 0.505 ms
QUICK_K_UNROLL, QUICK_SMALL_K_STEP = 1, 2
# Those whose rows are the batch on threads: tasks of SMALL_TASK_ROWS rows, or of more narrow
# rows, SMALL_TASK_WORK multiply-adds (``small_task_rows``; the tag's value). The task count
# follows the batch at run time: a batch of one task's rows or fewer (the moons step's) calls
# its task directly, queueing none; the narrow layers of 24-48-48-24 at batch 20000 ran on one
# core before.
SMALL_TASKS, SMALL_TASK_ROWS, SMALL_TASK_WORK = "mlirnn.small_tasks", 512, 1 << 20
# Wider rows (SMALL_TASK_ROWS of them with at least WIDE_TASK_WORK multiply-adds) in shorter tasks: the
# 1024 x 10 output layer of the large step at batch 512 ran as one task of 512 rows on one thread
# (143 us alone, two threads); in 4 tasks of 128 rows, 87 us (near and far alike)
WIDE_TASK_WORK = 4 * SMALL_TASK_WORK
# Small products whose vector rows are longer than one register but not a power of two of them
# (20, 24, 48 floats) are split there into two (16 + 4, 16 + 8, 32 + 16): LLVM widens such vectors
# to the next power of two and shuffles their pieces (x @ w over 50000 rows, one core: 48 x 48
# ran at 25 GFLOP/s, 32 x 32 and 64 x 64 at 85-90).
# (Longer rows, a width-one layer's weight gradient carried as rows of up to SMALL_CARRY_MAX, stay
# whole: split, some failed to vectorize.)
SPLIT_LANES, LANE_SPLIT_MAX = "mlirnn.split_lanes", 4  # (loop, size of the first part); registers
# The same split of a product whose rows are a dynamic batch, made inside each block of its rows: split
# first, each part was a pass over the batch of its own, reading A twice (1000-10 at batch 10000, x @ w:
# 4.35 -> 3.86 ms, one pass over x's 40 MB; a weight gradient's sum over the batch, split in its blocks,
# ran 35% slower: its accumulators were no longer carried in registers)
SPLIT_LANES_IN_BLOCKS = "mlirnn.split_lanes_in_blocks"
# ... and that of a weight gradient summed in equal chunks of its accumulator, made inside each chunk,
# so that the second part reads the chunk's columns of A from cache, not from memory again
SPLIT_LANES_IN_CHUNKS = "mlirnn.split_lanes_in_chunks"
SMALL_VECTOR_MAX = 1 << 12  # elements of the inner loops' vector (LLVM took minutes over 4100-lane vectors)
# A sum over the batch carries its accumulator through the batch loop: larger ones are split
# into chunks of at most this many elements, which stay in registers. A 256 x 10 weight gradient
# carried whole took LLVM 5 s; in chunks of 256 elements it compiles in a fraction of that and
# its step (256-10, batch 128, one core) went from about 60 to 33 us (512: 80 us, spilled).
SMALL_CARRY_MAX = 256
# Chunks of equal rows (a divisor of the row count, filling more than half of SMALL_CARRY_MAX)
# are one loop over the chunks, its body compiled once: as separate products, the ten chunks of a
# 256 x 10 weight gradient were ten kernels, more than half of the LLVM input of a 256-256-10 MLP.
SMALL_CHUNK = "mlirnn.small_chunk"  # the tile sizes of each chunk (one inner loop's)
# the same, the chunks as tasks on threads: when a batch row has SMALL_CHUNK_TASK_MIN multiply-adds
# (a 1000 x 10 weight gradient's 40 chunks of 25 x 10; smaller ones stay serial, as measured before),
# unless the batch (``Graph.batch_rows``) fills TASKS_MAX tasks of partial sums (``batch_split``): each
# chunk's task read a strip of every row of x, 4 KB apart, where a task of partial sums reads its
# rows whole (two cores of a Zen 5 EPYC: the 1000 x 10 weight gradient at batch 10000 2.9-3.0 ->
# 1.9-2.0 ms, the 1000-10 step 4.9-5.2 -> 3.6-3.7 ms, then 2.5-2.7 -> 1.5-1.8 ms with each task's rows in
# blocks that fit L2, ``_block_rows``; 1024 x 10 at batch 512 95-104 -> 87-89 us; 4096 x 10 at batch
# 32, 2 or 3 tasks of partial sums, 21.6-22.4 -> 24.0-27.1 us: chunk tasks kept there). Tasks of partial
# sums also need SPLIT_TASK_ROWS_MIN rows each: fewer, each partial's zero fill and sum (m x n) outweigh
# its rows (4096 x 10 at batch 128, 16 rows a task: 99-101 -> 112-136 us with the sum of the partials;
# at batch 256, 32 rows a task: 266-279 -> 214-230 us)
SMALL_CHUNK_TASKS, SMALL_CHUNK_TASK_MIN, SPLIT_TASK_ROWS_MIN = "mlirnn.small_chunk_tasks", 1 << 13, 32
# The blocks of a task's rows (``_block_rows``) fill half of L1 where that holds this many rows: each chunk
# then reads them from L1, not L2 (24-48-48-24 at batch 20000, blocks of 64 and 84 rows instead of 1364
# and 1820: weight gradients 48 x 48 322-328 -> 287-310 us, 48 x 24 224-233 -> 179-200, 24 x 48
# 169-172 -> 154-180; two cores of a Zen 5 EPYC, L1d 48 KiB)
L1_BLOCK_ROWS_MIN = 64


def _operand_dims(amap: ir.AffineMap) -> list[int]:
    return [ir.AffineDimExpr(e).position for e in amap.results]


def _sizes(op: ir.Operation) -> tuple[int, int, int]:
    """(m, n, k) with MLIR's dynamic-size marker for the batch dim."""
    ta, _ = matmul_transposes(op)
    a = ir.RankedTensorType(op.operands[0].type).shape
    c = ir.RankedTensorType(op.operands[2].type).shape
    return c[0], c[1], a[0] if ta else a[1]


def _static_work(op: ir.Operation) -> int:
    """m * n * k with dynamic dims counted as 1."""
    work = 1
    for d in _sizes(op):
        work *= 1 if ir.ShapedType.is_dynamic_size(d) else d
    return work


def _one_task(op: ir.Operation, batch_rows: int) -> tuple[int, int, int]:
    """(rows, n, depth) of the work at which a blocked product's threads are priced: the whole
    product, a dynamic dim (the batch, as rows or as k) counted as ``batch_rows``. The pool's
    cost is paid once per product, whatever its task count: priced at one task of mc rows (or
    one kc slice), a product over a large batch whose register blocks run fast looked too small
    for threads (a table measured on a Zen 5 core, 131 multiply-adds/ns: 8-64-64-1 at batch
    16384 ran its 64 x 64 products blocked on one thread, 1.7x the step time of vector rows on
    two)."""
    m, n, k = _sizes(op)
    dynamic = ir.ShapedType.is_dynamic_size
    return batch_rows if dynamic(m) else m, n, batch_rows if dynamic(k) else k


def _threading(op: ir.Operation, rates: ScheduleRates, batch_rows: int) -> tuple[Estimate, ...]:
    """A blocked product's tasks on the pool's threads or on one, priced at its whole work (``_one_task``)."""
    rows, n, depth = _one_task(op, batch_rows)
    return on_threads(rows * n * depth, rates)


def _blocking(op: ir.Operation, loops: LoopPlan, per_row: bool, rates: ScheduleRates,
              batch_rows: int) -> tuple[Estimate, ...] | None:
    """Blocked against loops for a product that may be blocked (static columns, a zero-filled
    accumulator, and k not 1: an outer product's k loop would fold away), the loops at the rate
    of the nest ``loops`` (its ``loop_plan``) makes; None when it may not. A product of static
    sizes is priced whole; one over a dynamic batch, when ``per_row`` (``_priced_per_row``), per
    batch row (``per_batch_row``), its fixed costs spread over ``batch_rows``."""
    m, n, k = _sizes(op)
    if ir.ShapedType.is_dynamic_size(n) or k == 1 or not _is_zero_fill(op.operands[2]):
        return None
    if not per_row:
        return blocked_or_loops(_static_work(op), _loop_nest_kind(loops), rates)
    itemsize = _itemsize(op.result)
    tm, _ = register_block(itemsize)
    rows = 1.0 if ir.ShapedType.is_dynamic_size(m) else _fill(m, _even_block_rows(m, tm))
    lane_rate = rates.blocked * rows * _fill(n, block_columns(n, itemsize))
    # blocked at its better orientation; one column swapped is a register block of one row, two of
    # the FMA chains the pipes need, slower than a dot product per row (3000 rows, one core: k = 64
    # 38 against 17 us, k = 4100 10.3 against 2.9 ms)
    fills = _swap_fills(op) if n > 1 else None
    lane_rate = lane_rate if fills is None else max(lane_rate, rates.swapped * fills[1])
    return per_batch_row(_static_work(op), lane_rate, _batch_loop_rate(op, loops, rates), rates,
                         loops_setup_ns=_transposed_back(op, loops) * TRANSPOSE_NS, batch_rows=batch_rows)


# A batch of at most this many rows reads a static B whose rows are over IN_PLACE_STRIDE_MAX
# apart, or a multiple of ALIASED_PITCH (``_columns_in_place``), in place: packing it costs a copy
# of B per call, which few rows do not pay back (two cores, 1024-4096-1024 SGD, B in place against
# packed: batch 16 -3..-7%, 64 +-2%, 192 0%, and the 784-1024-1024-10 step at batch 512 +2.5%;
# 64-256-256-64 at batch 1, its 1 KiB rows packed, 8.6% slower).
STRIDED_COLUMNS_ROWS_MAX = 32
# the depth of such a product's kc slices: a slice's rows of B fall on few sets of L1 and L2 (rows
# 8 KB apart: 8 of L2's 1024 sets), so each row panel reads lines of it from L3 again; shallower
# slices keep more of it (two cores, one process alternating both builds, kc 128 against 256:
# 1024-4096-1024 at batch 16 0.915x and 0.927x; 2048-2048-10 at batch 32 0.955x, then even within
# the 10% by which whichever build came first ran faster, its 16 MB weight placed apart)
STRIDED_COLUMNS_KC = 128


def _strided_columns(op: ir.Operation, columns: int, batch_rows: int) -> bool:
    """Whether the blocked ``op`` over a dynamic batch of about ``batch_rows`` rows reads its B
    (k, n) in place though its rows are over IN_PLACE_STRIDE_MAX bytes apart or a multiple of
    ALIASED_PITCH (register blocks ``columns`` wide)."""
    m, _, _ = _sizes(op)
    b, tb = op.operands[1], matmul_transposes(op)[1]
    pitch = _panel_pitch(b, tb, columns)
    return (ir.ShapedType.is_dynamic_size(m) and batch_rows <= STRIDED_COLUMNS_ROWS_MAX and pitch is not None
            and not _pitch_in_place(pitch))


def _column_tasks(op: ir.Operation, columns: int, batch_rows: int, threads: int) -> bool:
    """Whether a blocked product over a dynamic batch whose columns are one task's (n <= nc) goes on
    ``threads`` threads in tasks of SWAPPED_TASK_PANELS column panels (each over the whole batch)
    rather than of row panels: when the batch has fewer rows than B has columns, and the tasks share
    the panels evenly over the threads. Each thread then reads the whole of A but only its columns of B, the part of a
    weight that its own weight gradient's tasks wrote (their columns split the same way); in row
    tasks each thread reads all of B, half of it from the other core's cache (128-512-512-512-1 SGD
    at batch 256, two cores near: 2.06-2.14 -> 1.93-1.97 ms per step). 13 panels (300-400-300-1 at
    batch 128) would be tasks of 4, 4, 4 and 1: 8 of 13 on one of two threads, 3-5% slower."""
    m, n, _ = _sizes(op)
    if not ir.ShapedType.is_dynamic_size(m) or ir.ShapedType.is_dynamic_size(n):
        return False
    panels = -(-n // columns)
    _, nc, _ = cache_blocks(_itemsize(op.result))
    one_column_task = panels <= nc // register_block(_itemsize(op.result))[1]
    even = _largest_share(1, panels, (SWAPPED_TASK_PANELS, 1), threads) * threads == panels
    return one_column_task and even and batch_rows < n


def _priced_per_row(op: ir.Operation) -> bool:
    """Whether ``op`` is priced per batch row: its rows or k are the batch, and neither operand is
    a convolution's columns (their blocked panels are gathered from the image; the rates per row
    were measured on products of plain operands), whose dynamic dims count as 1."""
    m, _, k = _sizes(op)
    return not _static_sizes(m, k) and not any(im2col_source(x) is not None for x in op.operands[:2])


# A loop nest computing C^T and transposing it back pays that copy per call: 1 ns per element of C
# (a 64-1024-7 Adam step at batch 256 ran 24% slower with its 64 x 1024 weight gradient so,
# 9% faster at batch 4096; one core, 3000 rows: the product alone 1.14x faster than blocked).
TRANSPOSE_NS = 1.0


def _transposed_back(op: ir.Operation, plan: LoopPlan) -> int:
    """Elements of C that the loop nest ``plan`` computes as C^T and transposes back (a C of one
    column is read as a row instead)."""
    m, n, _ = _sizes(op)
    return m * n if plan.swapped and n > 1 and _static_sizes(m, n) else 0


def _batch_loop_rate(op: ir.Operation, plan: LoopPlan, rates: ScheduleRates) -> float:
    """The rate of the loop nest ``plan`` of ``op`` over a dynamic batch: vector rows or sums over
    the batch by the registers a row of their vector fills, or the plain rate."""
    if not plan.tags:
        return rates.plain_loops
    m, n, k = _sizes(op)
    dims = (n, m, k) if plan.swapped else (m, n, k)
    row = dims[plan.order[2]]
    if plan.chunk_axis == 2:
        row = plan.chunk or max(length for _, length in plan.chunks or ((0, row),))
    lanes = vector_bytes() // _itemsize(op.result)
    registers = row / lanes
    if plan.order[0] == 2:
        return batch_sums_rate(registers, _ragged(row, lanes), rates)
    return vector_rows_rate(registers, _ragged(row, lanes), rates)


def _ragged(size: int, lanes: int) -> bool:
    """Whether vector rows of ``size`` elements are, or keep after their split (``_lane_split``),
    a part shorter than a register that is no power of two of lanes (10 floats; 50 floats: 32 +
    18), which LLVM widens and shuffles (3000 rows of k = 300 times 10 columns, one core: 11
    multiply-adds/ns)."""
    point = _lane_split(size, lanes)
    part = size - point if point is not None else size
    return part & (part - 1) != 0 and (part < lanes or point is not None)


def _loop_nest_kind(plan: LoopPlan) -> str:
    """Which of ``schedule_costs.LOOP_NESTS`` the nest ``plan`` of a product of static sizes makes."""
    return "vector" if plan.tags else "plain"


def _narrow_over_batch(op: ir.Operation) -> bool:
    """Whether a product over the batch has a narrow static side (2 elements to fewer than one
    vector register's lanes): a forward product C (batch, n) with a static k in whole SMALL_K_STEP steps, or a
    weight gradient op(A)^T B summed over the batch with m or n narrow. Blocked, both pack
    a copy of the batch's whole input (a transposing one for the swapped forward product),
    which costs more than the narrow product itself: 1000-10 at batch 10000, one core,
    19.5 -> 8.7 ms per step, 1024-10 at 512 0.48 -> 0.34 ms. They run as vector code per
    block of rows (``SMALL_ROWS``), the forward in steps of k, the gradient in chunks."""
    m, n, k = _sizes(op)
    ta, tb = matmul_transposes(op)
    lanes = vector_bytes() // _itemsize(op.result)

    def narrow(size: int) -> bool:
        return not ir.ShapedType.is_dynamic_size(size) and 1 < size < lanes

    if ir.ShapedType.is_dynamic_size(m) and not ta:
        return narrow(n) and _static_sizes(k) and k % SMALL_K_STEP == 0
    return (ir.ShapedType.is_dynamic_size(k) and ta and not tb and _static_sizes(m, n)
            and (narrow(m) or narrow(n)) and _chunk_plan(m, n) is not None)


def _has_short_k(op: ir.Operation) -> bool:
    """k static and at most SHORT_K: a large product is then one pass (``short_products``)."""
    k = _sizes(op)[2]
    return not ir.ShapedType.is_dynamic_size(k) and k <= SHORT_K


def _over_batch_rows(op: ir.Operation) -> bool:
    """Whether a product's rows are the (dynamic) batch and its columns static: with a short k,
    one element-wise pass merged with its epilogue pays at every width (no accumulator to
    fill, no separate pass over the output)."""
    m, n, _ = _sizes(op)
    return ir.ShapedType.is_dynamic_size(m) and not ir.ShapedType.is_dynamic_size(n)


def _static_sizes(*sizes: int) -> bool:
    return not any(ir.ShapedType.is_dynamic_size(d) for d in sizes)


@dataclass(frozen=True)
class LoopPlan:
    """How a product that is not blocked runs as a loop nest: the operands' transposes (B
    copied to (k, n) first when ``copy_b``), the loop order (of matmul dims m, n, k), the
    schedule tags of its vector code and, for a sum over the batch whose accumulator is
    large, the (offset, length) chunks of its inner loop at ``chunk_axis`` (a position in
    ``order``), or ``chunk``, the size of the equal chunks of one loop over them.
    ``row_vector``: vector code per row of a small static (k, n) B (or of a narrow one, in
    steps of k). ``swapped``: the plan of C^T = op(B)^T op(A)^T (the other fields are that
    product's), C (m, 1) read as (1, m), or computed into zeros and transposed back."""

    ta: bool
    tb: bool
    row_vector: bool
    copy_b: bool
    order: tuple[int, ...]
    tags: tuple[str, ...]
    chunks: tuple[tuple[int, int], ...] | None
    chunk: int | None = None
    chunk_axis: int = 1
    swapped: bool = False
    chunk_tasks: bool = False  # the loop over equal chunks runs them as tasks on threads
    split_rows: int | None = None  # a sum over the batch in tasks of at least this many rows (``batch_split``)


def loop_plan(op: ir.Operation, threads: bool, batch_rows: int | None = None) -> LoopPlan:
    """The loop nest ``_as_generic`` builds for ``op`` (part of its ``product_plan``), a dynamic
    batch estimated at ``batch_rows`` rows (unknown: None)."""
    ta, tb = matmul_transposes(op)
    m, n, k = _sizes(op)
    # A sum over the batch into a column, C (m, 1) = A^T B (a width-1 output layer's weight
    # gradient), is planned as the row C^T = B^T A: per batch row, a vector of m (as C (m, 1),
    # the vector code carried m vectors of one lane, scalar FMAs and spills). One whose rows are
    # few and long, as a 10 x 1000 weight gradient (PyTorch's layout), is computed as C^T, chunks
    # of its rows, and transposed back: in chunks of its columns (10 x 25) the vector code of
    # each was mostly lane inserts (1000-10 at batch 10000, one core: 34 vs 8.7 ms per step).
    swapped = ta and not tb and (n == 1 or _sum_in_column_chunks(op))
    if swapped:
        m, n, ta, tb = n, m, not tb, not ta
    # A product over a dynamic batch with a small static k x n becomes vector code per row
    # (``SMALL_VECTOR``) in the (m, k, n) order: per k, a broadcast of A[i, k] times the
    # contiguous row B[k, :]. A static B stored transposed is copied to (k, n) first (a
    # few KB, once per step): read as (n, k), each row's contraction was lowered to
    # shuffles of B's columns, redone for every row.
    k_steps = (ir.ShapedType.is_dynamic_size(m) and _static_sizes(k) and k > SMALL_K_STEP
               and k % SMALL_K_STEP == 0)
    row_vector = not ta and _static_sizes(n, k) and (
        k * n <= SMALL_VECTOR_MAX or (k_steps and n * SMALL_K_STEP <= SMALL_VECTOR_MAX))
    copy_b = row_vector and tb
    tb = tb and not copy_b
    # matmul_maps use dims (m, n, k) = (0, 1, 2); choose the loop order, then renumber.
    row_update = not tb and (row_vector or ir.ShapedType.is_dynamic_size(n) or n >= ROW_MIN)
    # A transposed (k, m) and B (k, n), e.g. a weight gradient: k outermost, so that every
    # inner loop reads rows (A[k, m] is a scalar, B[k, :] and C[m, :] contiguous).
    order = [2, 0, 1] if ta and not tb else [0, 2, 1] if row_update else [0, 1, 2]
    # A unit n (a width-1 output layer) is never the inner loop: vector code over [..., 1]
    # lowers to one scalar FMA per lane. Its forward product becomes a dot product of contiguous
    # rows per m, a loop nest that LLVM vectorizes (its sum marked reassoc).
    dot = n == 1 and order == [0, 2, 1]
    order = [0, 1, 2] if dot else order
    sizes = (m, n, k)  # indexed by matmul dim
    inner = [sizes[d] for d in order[1:]]
    # Over a dynamic batch, the vector code is per step of k in the (m, k, n) order, and per
    # equal chunk of a sum over the batch (k outermost: C is carried through the batch loop).
    over_batch = not _static_sizes(sizes[order[0]]) and _static_sizes(*inner)
    stepped = over_batch and order == [0, 2, 1] and k_steps
    carried = over_batch and order[0] == 2 and inner[0] * inner[1] > SMALL_CARRY_MAX
    equal_chunks = _chunk_plan(*inner) if carried else None
    elements = (SMALL_K_STEP * inner[1] if stepped else SMALL_CARRY_MAX if equal_chunks
                else inner[0] * inner[1] if _static_sizes(*inner) else SMALL_VECTOR_MAX + 1)
    tags: list[str] = []
    if elements <= SMALL_VECTOR_MAX and not dot:
        tags.append(SMALL_ROWS if over_batch else SMALL_VECTOR)
        if over_batch and threads and order[0] == 0:
            tags.append(SMALL_TASKS)
        if stepped:
            tags.append(SMALL_K_STEPS)
    chunked = carried and bool(tags)
    # the inner loop to split: the middle one unless it is a unit
    axis, chunk = equal_chunks if chunked and equal_chunks else (1 if inner[0] > 1 else 2, None)
    size, lanes = (inner[0], inner[1]) if axis == 1 else (inner[1], inner[0])
    chunks = tuple(_chunks(size, lanes)) if chunked and chunk is None else None
    rows_min = rows_per_task(inner[0] * inner[1])
    chunk_tasks = (chunk is not None and threads and inner[0] * inner[1] >= SMALL_CHUNK_TASK_MIN
                   and (batch_rows is None or batch_rows < TASKS_MAX * max(rows_min, SPLIT_TASK_ROWS_MIN)))
    # the other large sums over the batch (and those over a batch that fills TASKS_MAX tasks: see
    # SMALL_CHUNK_TASKS): the batch in ranges of partial sums, as tasks
    split = rows_min if chunked and threads and not chunk_tasks else None
    return LoopPlan(ta, tb, row_vector, copy_b, tuple(order), tuple(tags), chunks, chunk, axis, swapped,
                    chunk_tasks, split)


@dataclass(frozen=True)
class ProductPlan:
    """The schedule ``rewrite_matmuls`` gives a product, and why (the one place that decides;
    ``schedule_report`` prints it). ``kind``: "short-k" (one element-wise pass,
    ``short_products``), "blocked" or "blocked-swapped" (packed register blocks, ``_blocked``),
    "row-blocks" (a small product of a batch loop in register blocks of rows, ``row_blocks``),
    or a loop nest ("small-vector", "small-rows" or "loops", as ``loops`` says)."""

    kind: str
    threads: bool
    reason: str
    loops: LoopPlan | None = None  # the loop nest of a product that is not blocked
    tasks: tuple[int, int] | None = None  # (column, row) panels per task when not the default
    rows: int | None = None  # rows per register block of a "row-blocks" product
    columns: int | None = None  # columns per register block of a "blocked" product (``block_columns``)
    k_ranges: tuple[int, int, int] | None = None  # a "blocked" product's k (the batch) in tasks of at
    # least [0] rows from a batch of [1] rows, [2] of them at most (``_summed_in_tasks``)
    strided_columns: bool = False  # B read in place though its rows are far apart (``_strided_columns``)
    column_tasks: bool = False  # on threads in tasks of column panels only (``_column_tasks``)
    kc: int | None = None  # the depth of a "blocked" product's slices of k when not the default (``_slice_depth``)

    @property
    def blocked(self) -> bool:
        return self.kind.startswith("blocked")


def product_plan(op: ir.Operation, threads: bool, rates: ScheduleRates | None = None,
                 batch_rows: int | None = None) -> ProductPlan:
    """The schedule of the ``linalg.matmul`` ``op``, with its threads when ``threads`` allows them:
    of the schedules legal for it, the cheapest by ``rates`` (default: the active table,
    ``schedule_rates.active``), its reason naming the estimates compared. A dynamic batch counts
    as ``batch_rows`` rows (the step's ``Graph.batch_rows``; default BATCH_ROWS_ESTIMATE)."""
    rates = rates or active()
    batch_rows = batch_rows or BATCH_ROWS_ESTIMATE
    m, n, k = _sizes(op)
    rows = _row_blocks(op)
    if rows is not None:
        return ProductPlan("row-blocks", False, f"static work <= {ROW_BLOCK_WORK_MAX} in a batch loop: "
                           f"register blocks of {rows} rows", rows=rows)
    plan = loop_plan(op, threads, batch_rows)  # the loop nest it gets unless blocked (priced against blocked)
    per_row = _priced_per_row(op)
    blocking = _blocking(op, plan, per_row, rates, batch_rows)
    whole = "" if _static_sizes(m, k) else " (the batch counted as 1)"
    prefix, suffix = ("per batch row: ", "") if per_row else ("", whole)
    priced = f"{prefix}{compared(blocking)}{suffix}" if blocking else ""
    large = blocking is not None and blocking[0].name == "blocked"
    narrow = large and _narrow_over_batch(op)
    large = large and not narrow
    if (large or _over_batch_rows(op)) and _has_short_k(op):
        # (an element-wise pass: with threads, ``parallel_maps`` runs it in blocks of rows, several on threads)
        where = ", in blocks of rows (on threads where there are several)" if threads else ""
        return ProductPlan("short-k", threads, f"k <= {SHORT_K}: one pass with its epilogue{where}")
    swapping = _swapping(op, rates) if large else None
    swaps = swapping is not None and swapping[0].name == "blocked-swapped"
    small_swapped = swaps and _static_sizes(m, n, k) and m * n * k <= SWAPPED_LOOP_MAX
    large = large and not small_swapped
    if large:
        threading = _threading(op, rates, batch_rows)
        parallel = threads and threading[0].name != "one thread"
        task = "x".join(map(str, _one_task(op, batch_rows)))
        work = f"at {task}: {compared(threading)}{'' if threads else ' (one thread here)'}"
        if swaps:
            return ProductPlan("blocked-swapped", parallel, f"{priced}; n={n}: {compared(swapping)}; {work}")
        k_ranges = _k_ranges(op) if parallel else None
        tasks = _tasks(op, rates.threads) if parallel else None
        if tasks is not None:
            work += f", balanced tasks of {tasks[0]} x {tasks[1]} column x row panels"
        if k_ranges is not None:
            work += (f"; one task loop: from a batch of {k_ranges[1]}, up to {k_ranges[2]} tasks of at least "
                     f"{k_ranges[0]} batch rows into partial sums, else of C's tiles")
        columns = block_columns(n, _itemsize(op.result))
        if columns < register_block(_itemsize(op.result))[1]:
            work += f"; register blocks {columns} columns wide: n={n} leaves {n % columns} in the last"
        strided = _strided_columns(op, columns, batch_rows)
        if strided:
            work += f"; B read in place, its rows {n * _itemsize(op.result)} bytes apart: {batch_rows} rows"
        by_columns = parallel and _column_tasks(op, columns, batch_rows, rates.threads)
        if by_columns:
            work += f"; tasks of {SWAPPED_TASK_PANELS} column panels: {batch_rows} rows < n={n}"
        swept = None if k_ranges is not None or by_columns or strided else _task_rows(op, parallel, tasks, columns)
        depth, deep_why = _slice_depth(op, swept, k_ranges is not None, strided)
        if depth is not None:
            work += f"; kc slices {depth} deep: {deep_why}"
        return ProductPlan("blocked", parallel, f"{priced}; {work}", tasks=tasks, columns=columns,
                           k_ranges=k_ranges, strided_columns=strided, column_tasks=by_columns, kc=depth)
    why = ("dynamic columns" if ir.ShapedType.is_dynamic_size(n) else
           f"n={n}: {compared(swapping)}, static work <= {SWAPPED_LOOP_MAX}" if swapping and small_swapped else
           "over the batch with a side narrower than a vector" if narrow else
           priced if blocking else "k = 1" if k == 1 else "an accumulator that is not zero-filled")
    if not plan.tags:
        loops = "n = 1: a dot product per row" if n == 1 else f"inner loops dynamic or over {SMALL_VECTOR_MAX}"
        return ProductPlan("loops", False, f"{why}; {loops}", plan)
    dims = (n, m, k) if plan.swapped else (m, n, k)
    inner = [dims[d] for d in plan.order[1:]]
    swap = "as C^T = B^T A, " if plan.swapped else ""
    vector = f"{why}; {swap}a vector of {inner[0]} x {inner[1]} per {'mnk'[plan.order[0]]}"
    if plan.tags[0] == SMALL_VECTOR:
        return ProductPlan("small-vector", False, vector, plan)
    chunks = f", {len(plan.chunks)} chunks of at most {SMALL_CARRY_MAX} elements" if plan.chunks else ""
    if plan.chunk:
        pieces = [plan.chunk, inner[1]] if plan.chunk_axis == 1 else [inner[0], plan.chunk]
        chunks = f", {'tasks' if plan.chunk_tasks else 'a loop'} over chunks of {pieces[0]} x {pieces[1]} elements"
    if SMALL_K_STEPS in plan.tags:
        chunks += f", k in steps of {SMALL_K_STEP}"
    block = small_block_rows(plan.order, inner[1], _itemsize(op.result))
    if SMALL_TASKS in plan.tags:
        chunks += f", tasks of {small_task_rows(inner[0] * inner[1], block)} rows"
    if plan.split_rows:
        chunks += f", tasks of at least {plan.split_rows} batch rows into partial sums"
        if plan.chunk:
            chunks += f" in blocks of {_block_rows(op)} rows"
    return ProductPlan("small-rows", SMALL_TASKS in plan.tags or plan.chunk_tasks or bool(plan.split_rows),
                       f"{vector}, blocks of {block} rows{chunks}",
                       plan)


def _task_rows(op: ir.Operation, parallel: bool, tasks: tuple[int, int] | None, columns: int) -> int | None:
    """The rows of A that one task of a "blocked" product sweeps (as ``_blocked`` tags it): the
    schedule's row panels per task (``_schedule_text``: mc's, or a quarter of them where its
    columns are one task's, or ``tasks``') of register-block rows; one thread: all its rows where
    they are static, else None."""
    itemsize = _itemsize(op.result)
    tm = register_block(itemsize)[0]
    m, n, _ = _sizes(op)
    if not parallel:
        return None if ir.ShapedType.is_dynamic_size(m) else m
    if tasks is not None:
        return tasks[1] * tm
    fine = not ir.ShapedType.is_dynamic_size(n) and _one_column_task(_ceil_div(n, columns), columns, itemsize)
    return _task_row_panels(itemsize, fine) * tm


def _one_column_task(col_panels: int, tn: int, itemsize: int) -> bool:
    """Whether a product's ``col_panels`` column panels of ``tn`` columns fit one task's (nc): its
    default tasks are then of fewer row panels (PARALLEL_FINE)."""
    return col_panels <= cache_blocks(itemsize)[1] // tn


def _task_row_panels(itemsize: int, one_column_task: bool) -> int:
    """Row panels per default task of a product on threads (the schedule's, ``_schedule_text``): mc's,
    or a FINE_TASK_SHARE of them where its columns are one task's, so that a partial last task leaves
    the other cores little to wait for."""
    panels = cache_blocks(itemsize)[0] // register_block(itemsize)[0]
    return max(1, panels // FINE_TASK_SHARE) if one_column_task else panels


def _slice_depth(op: ir.Operation, swept: int | None, k_ranges: bool, strided: bool) -> tuple[int | None, str]:
    """(kc, why) of a blocked product whose slices of k are not ``cache_blocks``' deep, else (None, ""):
    deeper (``deep_kc``) where its tasks sweep ``swept`` rows of A (None where unknown: a weight
    gradient summed in ranges of the batch, ``k_ranges``, whose tasks sweep every row of C; tasks of
    column panels over the batch; B read in place from rows far apart, ``strided``, whose slice's
    lines fall on few sets of L1 and L2, so that each row panel reads it again from L3: a deep slice
    made the 2048-2048-10 step at batch 32 1.56x and 1024-4096-1024 at batch 16 1.19x slower);
    shallower where a weight gradient summed in ranges reads x in place (``_x_in_place_depth``), or
    B is ``strided`` (STRIDED_COLUMNS_KC)."""
    itemsize = _itemsize(op.result)
    default = cache_blocks(itemsize)[2]
    if swept is not None and (deep := deep_kc(swept, itemsize)) > default:
        return deep, f"tasks sweep {swept} rows of A"
    if k_ranges and (shallow := _x_in_place_depth(op)) is not None:
        return shallow, f"x read in place, its rows {_sizes(op)[0] * itemsize} bytes each"
    if strided and STRIDED_COLUMNS_KC < default:
        return STRIDED_COLUMNS_KC, "B's rows far apart"
    return None, ""


def _x_in_place_depth(op: ir.Operation) -> int | None:
    """kc of a weight gradient x^T g over a dynamic batch whose x is read in place (``_rows_in_place``)
    and whose tasks sweep all of x's m columns (summed in ranges of the batch): ``in_place_kc`` of
    x's m elements per batch row, where shallower than ``cache_blocks``'; None otherwise."""
    m, n, k = _sizes(op)
    a, ta = op.operands[0], matmul_transposes(op)[0]
    itemsize = _itemsize(op.result)
    if not ta or not ir.ShapedType.is_dynamic_size(k) or ir.ShapedType.is_dynamic_size(m):
        return None
    if _rows_in_place(a, ta, register_block(itemsize)[0], n) is None:
        return None
    depth = in_place_kc(m * itemsize, itemsize)
    return depth if depth < cache_blocks(itemsize)[2] else None


def _as_generic(op: ir.Operation, plan: LoopPlan) -> ir.Value:
    a, b, c = op.operands
    if plan.swapped and dim_sizes(c)[1] == 1:  # C (m, 1) as the row (1, m) of B^T A, and back
        return _transposed_vector(_loop_nest(op, b, a, _transposed_vector(c), plan))
    if plan.swapped:  # a zero-filled C as B^T A into zeros of its own, transposed back
        m, n = dim_sizes(c)
        return transposed(_loop_nest(op, b, a, _zeros([n, m], ir.RankedTensorType(c.type).element_type), plan))
    return _loop_nest(op, a, b, c, plan)


def _transposed_vector(x: ir.Value) -> ir.Value:
    """A (p, 1) or (1, p) tensor as the other one (reshapes: the same elements in the same order)."""
    sizes = dim_sizes(x)
    element = ir.RankedTensorType(x.type).element_type
    length = sizes[0] if sizes[1] == 1 else sizes[1]
    flat = tensor.collapse_shape(ir.RankedTensorType.get(_static([length]), element), x, [[0, 1]])
    return _expand(flat, [1, length] if sizes[1] == 1 else [length, 1], [[0, 1]])


def _loop_nest(op: ir.Operation, a: ir.Value, b: ir.Value, c: ir.Value, plan: LoopPlan) -> ir.Value:
    """C + op(A) op(B) as ``plan`` says (``op``'s operands, or those of its swapped product)."""
    if plan.copy_b:
        b = transposed(b)
    if plan.row_vector and ir.ShapedType.is_dynamic_size(_sizes(op)[0]) and _is_zero_fill(c):
        # an accumulator of its own: CSE merges equal fills, which bufferization then copies
        # apart (a memcpy of the whole (batch, n) output per product)
        c = _zeros(dim_sizes(c), ir.RankedTensorType(c.type).element_type)
    if plan.split_rows:
        return sum_over_batch([a, b], c, plan.split_rows, lambda a, b, c: _nest(a, b, c, plan),
                              _block_rows(op) if plan.chunk else None)
    return _nest(a, b, c, plan)


def _block_rows(op: ir.Operation) -> int:
    """Batch rows per block of the sum over the batch ``op`` (C (m, n), a row of its operands m + n
    elements) in a loop over chunks of its accumulator, which reads each of the block's rows once per
    chunk: those that fill half of L1 where they are L1_BLOCK_ROWS_MIN or more, else half of L2 (a
    multiple of SMALL_ROW_BLOCK, at least one)."""
    m, n, _ = _sizes(op)
    row_bytes = (m + n) * _itemsize(op.result)
    caches = data_cache_bytes()
    rows = caches[1] // 2 // row_bytes
    if rows < L1_BLOCK_ROWS_MIN:
        rows = caches[2] // 2 // row_bytes
    return max(SMALL_ROW_BLOCK, rows // SMALL_ROW_BLOCK * SMALL_ROW_BLOCK)


def _nest(a: ir.Value, b: ir.Value, c: ir.Value, plan: LoopPlan) -> ir.Value:
    """C + op(A) op(B) as the loop nest of ``plan``, its accumulator in chunks when it has some."""
    order, tags = list(plan.order), list(plan.tags)
    if plan.chunks is None:
        product = _looped(a, b, c, plan.ta, plan.tb, order, tags, chunk_loop=bool(plan.chunk))
        if plan.chunk:
            tiles = [0, 0, 0]
            tiles[plan.chunk_axis] = plan.chunk
            tag = SMALL_CHUNK_TASKS if plan.chunk_tasks else SMALL_CHUNK
            product.owner.attributes[tag] = ir.DenseI64ArrayAttr.get(tiles)
        return product
    return _in_chunks(a, b, c, plan.ta, plan.tb, order, tags, list(plan.chunks), plan.chunk_axis)


def _looped(a: ir.Value, b: ir.Value, c: ir.Value, ta: bool, tb: bool, order: list[int],
            tags: list[str], chunk_loop: bool = False) -> ir.Value:
    """C + op(A) op(B) as a ``linalg.generic`` with loops in ``order`` (of matmul dims m, n, k);
    ``chunk_loop``: the schedule runs it in a loop over equal chunks (``SMALL_CHUNK``)."""
    position = {dim: i for i, dim in enumerate(order)}
    maps = [dims_map(3, [position[d] for d in _operand_dims(amap)]) for amap in matmul_maps(ta, tb)]
    iterators = [REDUCTION if d == 2 else PARALLEL for d in order]
    fastmath = ir.Attribute.parse("#arith.fastmath<reassoc,contract>")

    @linalg.generic([a, b], [c], maps, iterators)
    def product(x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
        return arith.addf(acc, arith.mulf(x, y, fastmath=fastmath), fastmath=fastmath)

    for tag in tags:
        product.owner.attributes[tag] = ir.UnitAttr.get()
    lanes = dim_sizes(c)[1] if order[2] == 1 else None  # the vector code's lanes: C's rows
    block = small_block_rows(order, lanes, _itemsize(c))
    if SMALL_ROWS in tags:  # its value: rows per block
        product.owner.attributes[SMALL_ROWS] = ir.DenseI64ArrayAttr.get([block])
    if SMALL_TASKS in tags:  # its value: rows per task (rows are the batch, a row's work is k * n)
        k = ir.RankedTensorType(a.type).shape[0 if ta else 1]
        rows = small_task_rows(k * ir.RankedTensorType(c.type).shape[1], block)
        product.owner.attributes[SMALL_TASKS] = ir.DenseI64ArrayAttr.get([rows])
    point = _lane_split(lanes, vector_bytes() // _itemsize(c))
    if tags and point is not None:
        tag = (SPLIT_LANES_IN_BLOCKS if SMALL_ROWS in tags and order[0] == 0 else
               SPLIT_LANES_IN_CHUNKS if chunk_loop else SPLIT_LANES)
        product.owner.attributes[tag] = ir.DenseI64ArrayAttr.get([2, point])
    return product


def small_task_rows(row_work: int, block: int) -> int:
    """Batch rows per task of a SMALL_TASKS product whose row has ``row_work`` multiply-adds, in
    blocks of ``block`` rows: SMALL_TASK_ROWS, or a multiple of ``block`` rows with
    SMALL_TASK_WORK; when SMALL_TASK_ROWS rows carry WIDE_TASK_WORK or more, the fewest rows
    that carry SMALL_TASK_WORK, rounded up to a power of two."""
    blocks = -(-SMALL_TASK_WORK // (row_work * block))
    if row_work * SMALL_TASK_ROWS >= WIDE_TASK_WORK:  # (a power of two: the usual batches split evenly)
        return 1 << (blocks * block - 1).bit_length()
    return max(SMALL_TASK_ROWS, blocks * block)


def small_block_rows(order: Iterable[int], row_size: int | None, itemsize: int) -> int:
    """Rows per block of a SMALL_ROWS product with loops in ``order`` (of matmul dims m, n, k),
    ``row_size`` the length of its innermost loop: NARROW_ROW_BLOCK where the rows are the
    batch, the innermost loop is C's rows and they fit NARROW_ROW_VECTORS of 32 vector
    registers (AVX-512), else SMALL_ROW_BLOCK."""
    order = tuple(order)
    narrow = (order[0] == 0 and order[2] == 1 and row_size is not None
              and row_size * itemsize <= NARROW_ROW_VECTORS * vector_bytes())
    return NARROW_ROW_BLOCK if narrow and vector_bytes() == 64 else SMALL_ROW_BLOCK


def _lane_split(size: int | None, lanes: int) -> int | None:
    """Where to split a vector code's static rows of ``size`` elements (``lanes`` per
    register), when they are longer than one register and at most LANE_SPLIT_MAX: after the
    most whole registers that are a power of two, when the rows are longer than that (None:
    they are not)."""
    if size is None or not lanes < size <= LANE_SPLIT_MAX * lanes:
        return None
    point = lanes << ((size // lanes).bit_length() - 1)
    return point if point < size else None


def _loop_chunk(size: int, lanes: int) -> int | None:
    """The rows of equal chunks of ``size`` rows of ``lanes`` elements for one loop over them:
    the largest divisor of ``size`` with at most SMALL_CARRY_MAX elements, None when it has at
    most half of that."""
    rows = max((d for d in range(1, SMALL_CARRY_MAX // lanes + 1) if size % d == 0), default=0)
    return rows if 2 * rows * lanes > SMALL_CARRY_MAX else None


def _sum_in_column_chunks(op: ir.Operation) -> bool:
    """Whether a sum over the batch into a zero-filled C (m, n) would be chunked by columns
    (``_chunk_plan``) where C^T would be chunked by rows."""
    m, n, k = _sizes(op)
    if not (ir.ShapedType.is_dynamic_size(k) and _static_sizes(m, n) and m * n > SMALL_CARRY_MAX
            and _is_zero_fill(op.operands[2])):
        return False
    plan, swapped = _chunk_plan(m, n), _chunk_plan(n, m)
    return plan is not None and plan[0] == 2 and swapped is not None and swapped[0] == 1


def _chunk_plan(rows: int, columns: int) -> tuple[int, int] | None:
    """(axis, size) of equal chunks, one loop over them, of a (rows, columns) accumulator carried
    through the batch loop: chunks of its rows (axis 1), or of its columns (axis 2) when a row
    alone has more than SMALL_CARRY_MAX elements (a 10 x 1000 weight gradient: 10 x 25); None
    when neither has a divisor that makes them large enough (``_loop_chunk``)."""
    if rows > 1 and (chunk := _loop_chunk(rows, columns)) is not None:
        return 1, chunk
    if columns > SMALL_CARRY_MAX and (chunk := _loop_chunk(columns, rows)) is not None:
        return 2, chunk
    return None


def _chunks(size: int, lanes: int) -> list[tuple[int, int]]:
    """(offset, length) chunks of ``size`` about equal, each with at most SMALL_CARRY_MAX / ``lanes``
    (at least one)."""
    count = min(size, -(-size * lanes // SMALL_CARRY_MAX))
    step = -(-size // count)
    return [(start, min(step, size - start)) for start in range(0, size, step)]


def _along(value: ir.Value, axis: int | None, offset: int, length: int) -> ir.Value:
    """``value`` sliced to ``length`` at ``offset`` along ``axis`` (None: all of it)."""
    if axis is None:
        return value
    sizes = dim_sizes(value)
    sizes[axis] = length
    offsets: list[int | ir.Value] = [0] * len(sizes)
    offsets[axis] = offset
    return _part(value, offsets, sizes)


def _in_chunks(a: ir.Value, b: ir.Value, c: ir.Value, ta: bool, tb: bool, order: list[int], tags: list[str],
               chunks: list[tuple[int, int]], axis: int) -> ir.Value:
    """``_looped`` split along its inner loop at position ``axis`` of ``order`` into ``chunks``,
    so that the vector code of each carries at most SMALL_CARRY_MAX elements through the outer
    (batch) loop: chunks of C's rows or columns written into it, or of k accumulated one after
    the other."""
    dim = order[axis]
    a_map, b_map, c_map = (_operand_dims(amap) for amap in matmul_maps(ta, tb))
    axes = [dims.index(dim) if dim in dims else None for dims in (a_map, b_map, c_map)]
    total = c
    for offset, length in chunks:
        a_part, b_part = _along(a, axes[0], offset, length), _along(b, axes[1], offset, length)
        if axes[2] is None:  # a chunk of k: accumulated into the whole C
            total = _looped(a_part, b_part, total, ta, tb, order, tags)
            continue
        part = _looped(a_part, b_part, _along(total, axes[2], offset, length), ta, tb, order, tags)
        sizes = dim_sizes(total)
        sizes[axes[2]] = length
        offsets: list[int | ir.Value] = [0] * len(sizes)
        offsets[axes[2]] = offset
        total = _put(part, total, offsets, sizes)
    return total


def _static(sizes: list[int | ir.Value]) -> list[int]:
    return [d if isinstance(d, int) else ir.ShapedType.get_dynamic_size() for d in sizes]


def _empty(sizes: list[int | ir.Value], element: ir.Type) -> ir.Value:
    return tensor.empty(sizes, element)


def _ceil_div(size: int | ir.Value, tile: int) -> int | ir.Value:
    if isinstance(size, int):
        return -(-size // tile)
    index = ir.IndexType.get()
    return arith.divui(arith.addi(size, arith.constant(index, tile - 1)), arith.constant(index, tile))


def _times(size: int | ir.Value, factor: int) -> int | ir.Value:
    return size * factor if isinstance(size, int) else arith.muli(size, arith.constant(ir.IndexType.get(), factor))


def _slice(value: ir.Value, sizes: list[int | ir.Value]) -> ir.Value:
    """The leading ``sizes`` corner of a 2-D tensor."""
    kind = ir.RankedTensorType.get(_static(sizes), ir.RankedTensorType(value.type).element_type)
    dynamic = [d for d in sizes if isinstance(d, ir.Value)]
    return tensor.extract_slice(kind, value, [], dynamic, [], [0, 0], _static(sizes), [1, 1])


def _zero_padded(value: ir.Value, axis: int, size: int | ir.Value) -> ir.Value:
    """``value`` with dim ``axis`` zero-padded to ``size``: a zero-filled tensor with the
    value copied into its corner (linalg.copy, which vectorizes, not a strided memref copy)."""
    sizes = dim_sizes(value)
    element = ir.RankedTensorType(value.type).element_type
    padded = list(sizes)
    padded[axis] = size
    into = _zeros(padded, element)
    corner = linalg.copy(value, outs=[_slice(into, sizes)])
    dynamic = [d for d in sizes if isinstance(d, ir.Value)]
    return tensor.insert_slice(corner, into, [], dynamic, [], [0, 0], _static(sizes), [1, 1])


def _zeros(sizes: list[int | ir.Value], element: ir.Type) -> ir.Value:
    """A zero-filled tensor in a buffer of its own: alloc_tensor, not tensor.empty, since CSE
    would merge equal fills of equal shapes, which bufferization then copies apart."""
    kind = ir.RankedTensorType.get(_static(sizes), element)
    fresh = bufferization.alloc_tensor(kind, [d for d in sizes if isinstance(d, ir.Value)])
    return linalg.fill(arith.constant(element, 0.0), outs=[fresh])


def _expand(value: ir.Value, sizes: list[int | ir.Value], reassociation: list[list[int]]) -> ir.Value:
    element = ir.RankedTensorType(value.type).element_type
    kind = ir.RankedTensorType.get(_static(sizes), element)
    dynamic = [d for d in sizes if isinstance(d, ir.Value)]
    return tensor.expand_shape(kind, value, reassociation, dynamic, _static(sizes))


def _part(value: ir.Value, offsets: list[int | ir.Value], sizes: list[int | ir.Value]) -> ir.Value:
    """The slice of ``value`` at ``offsets`` with ``sizes`` (unit strides)."""
    kind = ir.RankedTensorType.get(_static(sizes), ir.RankedTensorType(value.type).element_type)
    dynamic_offsets = [d for d in offsets if isinstance(d, ir.Value)]
    dynamic_sizes = [d for d in sizes if isinstance(d, ir.Value)]
    return tensor.extract_slice(kind, value, dynamic_offsets, dynamic_sizes, [], _static(offsets), _static(sizes),
                                [1] * len(sizes))


def _put(part: ir.Value, into: ir.Value, offsets: list[int | ir.Value], sizes: list[int | ir.Value]) -> ir.Value:
    """``into`` with ``part`` written at ``offsets``."""
    dynamic_offsets = [d for d in offsets if isinstance(d, ir.Value)]
    dynamic_sizes = [d for d in sizes if isinstance(d, ir.Value)]
    return tensor.insert_slice(part, into, dynamic_offsets, dynamic_sizes, [], _static(offsets), _static(sizes),
                               [1] * len(sizes))


def _pack_whole_panels(x: ir.Value, axis: int, tile: int, into: ir.Value, rows_tag: str | None,
                       parallel: bool, panels: ir.Value | None = None, factor: Update | None = None) -> ir.Value:
    """``x`` (its dim ``axis`` a multiple of ``tile``) as panels [s / tile, o, tile] written into
    ``into`` (only its first ``panels`` when given); tagged for the schedule (``rows_tag`` when it
    copies rows) unless ``rows_tag`` is None. Rows whose count o is the batch are copied in
    groups (``_pack_row_groups``). ``factor``: as ``_pack_copy``'s."""
    size, other = dim_sizes(x)[axis], dim_sizes(x)[1 - axis]
    count = _ceil_div(size, tile)
    if axis == 0:  # (s, o) -> [count, tile, o] -> [count, o, tile]
        split, perm = _expand(x, [count, tile, other], [[0, 1], [2]]), [0, 2, 1]
        if panels is not None:
            split = _part(split, [0, 0, 0], [panels, tile, other])
        if rows_tag is not None and isinstance(other, int) and other >= TRANSPOSE_TILE:
            return _pack_transposed(split, into, tile, other, parallel, factor)
        tag = PACK
    elif rows_tag is not None and isinstance(other, ir.Value) and panels is None:
        return _pack_row_groups(x, tile, into, rows_tag, parallel, factor)
    else:  # (o, s) -> [o, count, tile] -> [count, o, tile]
        split, perm = _expand(x, [other, count, tile], [[0], [1, 2]]), [1, 0, 2]
        tag = rows_tag
        if panels is not None:
            split = _part(split, [0, 0, 0], [other, panels, tile])
    return _pack_copy(split, into, perm, tag if rows_tag is not None else None, parallel, factor)


def _pack_transposed(split: ir.Value, into: ir.Value, tile: int, other: int, parallel: bool,
                     factor: Update | None = None) -> ir.Value:
    """``split`` [p, tile, o] transposed into panels [p, o, tile]: the first o rounded down to a
    multiple of TRANSPOSE_TILE in vector tiles (squares of TRANSPOSE_TILE when the panels are
    wider), the few rows left by loops (all of it went by loops when o was not a multiple:
    a fifth of LeNet-5's training step at batch 256 went to transposing 25600 x 150 columns)."""
    panels = dim_sizes(split)[0]
    lead = other // TRANSPOSE_TILE * TRANSPOSE_TILE
    tag = PACK_SQUARES if tile > TRANSPOSE_TILE and tile % TRANSPOSE_TILE == 0 else PACK_TILES
    parts = [(0, lead, tag), (lead, other - lead, PACK)] if lead < other else [(0, other, tag)]
    for offset, length, part_tag in parts:
        part = _pack_copy(_part(split, [0, 0, offset], [panels, tile, length]),
                          _part(into, [0, offset, 0], [panels, length, tile]), [0, 2, 1], part_tag, parallel,
                          factor)
        into = _put(part, into, [0, offset, 0], [panels, length, tile])
    return into


def _pack_copy(split: ir.Value, into: ir.Value, perm: list[int], tag: str | None, parallel: bool,
               factor: Update | None = None) -> ir.Value:
    """``into`` = ``split`` with its dims permuted by ``perm``, tagged for the schedule; times the
    ``factor`` of an SGD update where given (the update's product then starts from the parameter
    with no scaled copy of an operand: a pass over x or dY, 0.7% of the 784-1024-1024-10 step)."""
    # a generic, not linalg.transpose: tiles that only move unit dims must not fold into copies
    pack = copy_times_factor(split, into, dims_map(len(perm), perm), factor)
    if tag is not None:
        pack.owner.attributes[tag] = ir.UnitAttr.get()
    if parallel:
        panels = dim_sizes(into)[0]
        few = isinstance(panels, int) and panels <= PACK_TASK_PANELS and tag in (PACK_ROWS_A, PACK_ROWS_B)
        spread = PACK_PARALLEL_GROUPS if tag == PACK_ROW_GROUPS else PACK_PARALLEL_ROWS if few else PACK_PARALLEL
        pack.owner.attributes[spread] = ir.UnitAttr.get()
    return pack


def _pack_row_groups(x: ir.Value, tile: int, into: ir.Value, rows_tag: str, parallel: bool,
                     factor: Update | None = None) -> ir.Value:
    """The rows of ``x`` (o, s), o the batch, as panels [s / tile, o, tile] in ``into``: the
    first PACK_ROWS_STEP * (o // PACK_ROWS_STEP) rows as groups of PACK_ROWS_STEP, a static
    shape that the schedule copies with plain vector loads and stores, then the last few
    rows as ``rows_tag`` copies, masked at the batch's end (masked loads and stores of
    every row cost up to 45% of a weight gradient's time)."""
    index = ir.IndexType.get()
    rows, size = dim_sizes(x)
    count = dim_sizes(into)[0]
    step = PACK_ROWS_STEP
    groups = arith.divui(rows, arith.constant(index, step))
    whole = _times(groups, step)
    split = _expand(_part(x, [0, 0], [whole, size]), [groups, step, count, tile], [[0, 1], [2, 3]])
    grouped = _expand(_part(into, [0, 0, 0], [count, whole, tile]), [count, groups, step, tile], [[0], [1, 2], [3]])
    copied = _pack_copy(split, grouped, [1, 2, 0, 3], PACK_ROW_GROUPS, parallel, factor)
    element = ir.RankedTensorType(x.type).element_type
    flat = tensor.collapse_shape(ir.RankedTensorType.get(_static([count, whole, tile]), element), copied,
                                 [[0], [1, 2], [3]])
    into = _put(flat, into, [0, 0, 0], [count, whole, tile])
    rest = arith.subi(rows, whole)
    tail = _expand(_part(x, [whole, 0], [rest, size]), [rest, count, tile], [[0], [1, 2]])
    packed_tail = _pack_copy(tail, _part(into, [0, whole, 0], [count, rest, tile]), [1, 0, 2], rows_tag, False,
                             factor)
    return _put(packed_tail, into, [0, whole, 0], [count, rest, tile])


def _panels(x: ir.Value, axis: int, tile: int, parallel: bool, rows_tag: str, factor: Update | None = None
            ) -> ir.Value:
    """A 2-D tensor as panels [ceil(s / tile), o, tile] of ``tile`` consecutive indices of
    its dim ``axis`` (size s; the other dim has size o), zero-padded to whole panels.
    Packing op(A) takes tiles of its rows, op(B) of its columns; a transposed operand is
    read in its own layout (the packing is the transpose). The whole panels are packed
    straight from ``x`` (vector copies, on threads for large products); a partial last
    panel is packed from a zero-padded copy of its few rows or columns. ``factor``: an SGD update
    whose factor scales x as it is packed (``copy_times_factor``)."""
    sizes = dim_sizes(x)
    size, other = sizes[axis], sizes[1 - axis]
    element = ir.RankedTensorType(x.type).element_type
    count = _ceil_div(size, tile)
    packed = _empty([count, other, tile], element)
    if isinstance(size, int) and size % tile == 0:
        return _pack_whole_panels(x, axis, tile, packed, rows_tag, parallel, factor=factor)
    index = ir.IndexType.get()
    full = size // tile if isinstance(size, int) else arith.divui(size, arith.constant(index, tile))
    whole = _times(full, tile)

    def along(offset: int | ir.Value, length: int | ir.Value) -> tuple[list, list]:
        """(offsets, sizes) of a slice of x over [offset, offset + length) of dim ``axis``."""
        return ([offset, 0], [length, other]) if axis == 0 else ([0, offset], [other, length])

    if not (isinstance(full, int) and full == 0):
        main = _part(x, *along(0, whole))
        into = _part(packed, [0, 0, 0], [full, other, tile])
        packed = _put(_pack_whole_panels(main, axis, tile, into, rows_tag, parallel, factor=factor), packed,
                      [0, 0, 0], [full, other, tile])
    rest = size - whole if isinstance(size, int) else arith.subi(size, whole)
    left = _part(x, *along(whole, rest))
    left = left if factor is None else scaled(left, factor)  # (a few rows or columns)
    if axis == 1 and isinstance(size, int):
        panel = _column_tail(left, _part(packed, [full, 0, 0], [1, other, tile]))
        return _put(panel, packed, [full, 0, 0], [1, other, tile])
    tail = _zero_padded(left, axis, tile)
    missing = count - full if isinstance(count, int) else arith.subi(count, full)  # 0 or 1 panels
    into = _part(packed, [full, 0, 0], [missing, other, tile])
    last = _pack_whole_panels(tail, axis, tile, into, None, False, None if isinstance(missing, int) else missing)
    return _put(last, packed, [full, 0, 0], [missing, other, tile])


def _column_tail(tail: ir.Value, into: ir.Value) -> ir.Value:
    """The last column panel ``into`` [1, o, tile] of B: the ``tail`` (o, r) columns left after
    the whole panels in its first r columns, zeros after them, written in place by a copy and
    a generic (``parallel_maps`` spreads large ones on threads). Before, a zero-filled
    padded copy of the tail was packed into the panel: a memset and two copies, all on one
    thread (4% of LeNet-5's step at batch 256, whose weight gradient has 150 columns)."""
    other, rest = dim_sizes(tail)
    tile = dim_sizes(into)[2]
    element = ir.RankedTensorType(tail.type).element_type
    panel = tensor.collapse_shape(ir.RankedTensorType.get(_static([other, tile]), element), into, [[0, 1], [2]])
    identity = dims_map(2, [0, 1])
    zero = arith.constant(element, 0.0)

    @linalg.generic([], [_part(panel, [0, rest], [other, tile - rest])], [identity], [PARALLEL] * 2)
    def zeros(_out: ir.Value) -> ir.Value:
        return zero

    panel = _put(zeros, panel, [0, rest], [other, tile - rest])
    copied = linalg.copy(tail, outs=[_part(panel, [0, 0], [other, rest])])  # (a generic copy folds away)
    panel = _put(copied, panel, [0, 0], [other, rest])
    return _expand(panel, [1, other, tile], [[0, 1], [2]])


def _is_zero_fill(value: ir.Value) -> bool:
    """True when ``value`` is a linalg.fill with the constant 0 (the products' accumulators)."""
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "linalg.fill":
        return False
    scalar = owner.operands[0].owner
    if isinstance(scalar, ir.Block) or scalar.name != "arith.constant":
        return False
    value_attr = scalar.attributes["value"]
    return isinstance(value_attr, ir.FloatAttr) and value_attr.value == 0.0


def _fill(size: int, tile: int) -> float:
    """The share of ``size`` indices in its whole ``tile``-sized panels."""
    return size / (-(-size // tile) * tile)


def _even_block_rows(rows: int, tm: int) -> int:
    """Register block rows for ``rows`` static rows: the fewest blocks of at most ``tm`` rows,
    as even as they come (all rows when they fit; 16 rows: two blocks of 8, not 12 and 4 of
    padding, a third of the product's FMAs wasted)."""
    return -(-rows // -(-rows // tm))


def _swap_fills(op: ir.Operation) -> tuple[float, float] | None:
    """The shares of its register blocks' lanes a product with fewer columns (the static n) than a
    register block's fills as it is and swapped (C^T = op(B)^T op(A)^T); None for others. E.g. the
    10-wide output layer fills 10 of 32 columns of a block but all of a 10-row block. A dynamic row
    count (the batch) is taken as large."""
    m, n, _ = _sizes(op)
    tm, tn = register_block(_itemsize(op.result))
    if n >= tn:
        return None
    rows = 1.0 if ir.ShapedType.is_dynamic_size(m) else _fill(m, _even_block_rows(m, tm))
    columns = 1.0 if ir.ShapedType.is_dynamic_size(m) else _fill(m, tn)
    return rows * _fill(n, tn), _fill(n, _even_block_rows(n, tm)) * columns


def _swapping(op: ir.Operation, rates: ScheduleRates) -> tuple[Estimate, ...] | None:
    """A blocked product against the same swapped, each at the share of its register blocks'
    lanes it fills (``_swap_fills``; None for a product with as many columns as a block)."""
    fills = _swap_fills(op)
    return None if fills is None else swapped_or_not(_static_work(op), *fills, rates)


def block_columns(n: int, itemsize: int) -> int:
    """Columns of a blocked product's register blocks: two vector registers (``register_block``),
    or one when that computes NARROW_SAVING_MIN less padding for a static n of more than two:
    a 100-wide layer's products ran at 68-77 GFLOP/s in blocks of 12 x 32 (128 columns computed),
    at 77-86 in blocks of 12 x 16 (112), one core of a Zen 4; blocks of 12 x 16 ran 0-4% slower
    where neither pads (1024 columns), so n = 1000 (1008 against 1024 computed) keeps 12 x 32.
    Only with at least NARROW_ROWS_MIN rows per block: with AVX2's 6 x 8 (six FMA chains) the
    100-100-100-100-1 Adam step at batch 5000 ran 15% slower than in 6 x 16 blocks (Zen 3, 2 cores)."""
    tm, tn = register_block(itemsize)
    lanes = tn // 2
    if not isinstance(n, int) or n <= tn or tm < NARROW_ROWS_MIN:
        return tn
    saved = _ceil_div(n, tn) * tn - _ceil_div(n, lanes) * lanes
    return lanes if saved > NARROW_SAVING_MIN * n else tn


def _row_blocks(op: ir.Operation) -> int | None:
    """Rows per register block of a static product with at most ROW_BLOCK_WORK_MAX work that is
    one matrix of a batch loop (``row_blocks``), or None."""
    m, n, k = _sizes(op)
    if not _static_sizes(m, n, k) or m * n * k > ROW_BLOCK_WORK_MAX or op.parent.name != "scf.for":
        return None
    return block_rows(m, n, k, ir.FloatType(ir.RankedTensorType(op.result.type).element_type).width)


def _tasks(op: ir.Operation, threads: int) -> tuple[int, int] | None:
    """``balanced_tasks`` of a blocked product with static rows on ``threads`` threads (None: the default tasks)."""
    m, n, _ = _sizes(op)
    if ir.ShapedType.is_dynamic_size(m):
        return None
    itemsize = _itemsize(op.result)
    tm, tn = register_block(itemsize)[0], block_columns(n, itemsize)
    a, ta = op.operands[0], matmul_transposes(op)[0]
    rows, columns = _image_panels(a, ta, tm)
    tm = (None if columns is not None else _rows_in_place(a, ta, tm, n)) or rows  # the register blocks' rows
    mc, nc, _ = cache_blocks(itemsize)
    return balanced_tasks(-(-m // tm), -(-n // tn), mc // tm, nc // tn, threads)


def _k_ranges(op: ir.Operation) -> tuple[int, int, int] | None:
    """(rows per task at least, batch from which, tasks at most) of a weight gradient summed over
    a dynamic batch, op(A)^T B with a static C of at most K_RANGES_OUTPUT_MAX elements and no
    convolution columns, whose tasks take ranges of the batch from that batch on
    (``_summed_in_tasks``), their partial sums K_RANGES_PARTIALS_BYTES at most; None otherwise."""
    m, n, k = _sizes(op)
    ta, tb = matmul_transposes(op)
    if not (ta and not tb and ir.ShapedType.is_dynamic_size(k) and _static_sizes(m, n)
            and m * n <= K_RANGES_OUTPUT_MAX):
        return None
    if _image_panels(op.operands[0], ta, register_block(_itemsize(op.result))[0])[1] is not None:
        return None
    rows = max(rows_per_task(m * n), TASKS_MAX)  # (at least TASKS_MAX rows: no task starts past the batch)
    ranges = max(2, min(TASKS_MAX, K_RANGES_PARTIALS_BYTES // (m * n * _itemsize(op.result))))
    return rows, max(2 * rows, K_RANGES_ROWS_PER_OUTPUT * -(-2 * m * n // (m + n))), ranges


def _as_blocked(op: ir.Operation, plan: ProductPlan, number: int, update: Update | None = None) -> ir.Value:
    """The blocked product of a large ``linalg.matmul`` (``_blocked``), as C^T transposed
    back when its columns are few (``_swapping``); with ``update``, the updated parameter, its
    operand with fewer columns scaled by the update's factor as it is packed (``update_of``)."""
    a, b, _ = op.operands
    ta, tb = matmul_transposes(op)
    parallel = plan.threads
    if update is not None:
        m, n, _ = _sizes(op)
        return _blocked(a, b, ta, tb, parallel, False, _update_tasks(op, plan), plan.columns, number,
                        update.parameter, kc=update_slice_depth(op, plan)[0],
                        factors=(update, None) if m <= n else (None, update))
    if plan.kind == "blocked":
        return _blocked(a, b, ta, tb, parallel, False, plan.tasks, plan.columns, number, k_ranges=plan.k_ranges,
                        strided_columns=plan.strided_columns, column_tasks=plan.column_tasks, kc=plan.kc)
    return transposed(_blocked(b, a, not tb, not ta, parallel, True))


def _update_tasks(op: ir.Operation, plan: ProductPlan) -> tuple[int, int]:
    """(column, row) panels per task of a blocked product that accumulates into its parameter: one
    row panel, all its columns, so that its blocks walk along the parameter's rows (down its columns,
    16 KB apart for a 4096-wide layer, the products were as slow as product and update apart)."""
    return _sizes(op)[1] // (plan.columns or register_block(_itemsize(op.result))[1]), 1


def update_slice_depth(op: ir.Operation, plan: ProductPlan) -> tuple[int | None, str]:
    """(kc, why) of a blocked product that accumulates into its parameter (``update_of``), as
    ``_slice_depth``'s for the rows of A its tasks sweep (``_update_tasks``: one register block's on
    threads), so its slices are ``deep_kc``'s. Each slice loads and stores every register block of the parameter
    again, from rows 4 KB apart for a 1024-wide layer (two cores of a Zen 5 EPYC, L1d 48 KiB: the
    784-1024-1024-10 step at batch 512, its 1024 x 1024 x 512 weight gradient 2511-2554 -> 2424-2440 us
    and 784 x 1024 x 512 1953-1982 -> 1881-1889 us in one slice instead of three of 192)."""
    tasks = _update_tasks(op, plan)
    return _slice_depth(op, _task_rows(op, plan.threads, tasks, _sizes(op)[1] // tasks[0]), False, False)


def update_of(op: ir.Operation, plan: ProductPlan) -> Update | None:
    """The SGD update of a blocked product (``parameter_update``) that it can accumulate into:
    static sizes, whole column panels, at least one row panel, no convolution columns, the
    parameter an argument of the step and the factor one or a constant (both there before the
    product), and the parameter's rows more than IN_PLACE_STRIDE_MAX bytes apart: there the update
    pass cost most (one process alternating both builds, one core: 1024-4096-1024 SGD at batch 16
    -13.7%, 784-1024-1024-10 at batch 512 -2.8%; narrower layers showed no gain, +3% at 256 wide)."""
    m, n, _ = _sizes(op)
    tm = register_block(_itemsize(op.result))[0]
    if (plan.kind != "blocked" or not _static_sizes(m, n) or n % (plan.columns or 1) or m < tm
            or n * _itemsize(op.result) <= IN_PLACE_STRIDE_MAX):
        return None
    a, ta = op.operands[0], matmul_transposes(op)[0]
    if _image_panels(a, ta, tm)[1] is not None:
        return None
    update = parameter_update(op.result)
    if update is None or not isinstance(update.parameter.owner, ir.Block):
        return None
    return update if isinstance(update.factor, float) or isinstance(update.factor.owner, ir.Block) else None


def balanced_tasks(row_panels: int, col_panels: int, max_rows: int, max_cols: int,
                   threads: int = 1) -> tuple[int, int] | None:
    """(column panels, row panels) per task of a product with static rows, when the default
    tasks of ``max_cols`` x ``max_rows`` panels would be fewer than 2 * BALANCED_TASKS_MIN:
    at least BALANCED_TASKS_MIN tasks where the panels allow, of equal size (the default
    left a weight gradient of 9 x 6 panels with a huge k as one task on one core, and split
    18 column panels 16 + 2); None keeps the default. Of that many tasks and up to ``threads``
    - 1 more rows or columns of them, the split whose largest share on ``threads`` threads is
    least (``_largest_share``; ties to fewer tasks): 784 x 256 outputs (66 x 8 panels) in
    5 tasks of 14, 14, 14, 14 and 10 row panels left one of two threads 38 of 66, in 6 tasks
    of 11 each 33."""
    chunks_c, chunks_r = -(-col_panels // max_cols), -(-row_panels // max_rows)
    if chunks_c * chunks_r >= 2 * BALANCED_TASKS_MIN:
        return None
    while chunks_c * chunks_r < BALANCED_TASKS_MIN and (chunks_c < col_panels or chunks_r < row_panels):
        if chunks_c < col_panels and (col_panels / chunks_c >= row_panels / chunks_r or chunks_r == row_panels):
            chunks_c += 1
        else:
            chunks_r += 1
    splits = [(-(-col_panels // c), -(-row_panels // r))
              for c in range(chunks_c, min(chunks_c + threads, col_panels + 1))
              for r in range(chunks_r, min(chunks_r + threads, row_panels + 1))]
    return min(splits, key=lambda s: (_largest_share(row_panels, col_panels, s, threads),
                                      -(-col_panels // s[0]) * -(-row_panels // s[1])))


def _largest_share(row_panels: int, col_panels: int, split: tuple[int, int], threads: int) -> int:
    """Panels of the busiest of ``threads`` threads when tasks of ``split`` (column, row) panels
    go, largest first, to the least loaded thread."""
    cols, rows = split
    sizes = sorted((min(cols, col_panels - c) * min(rows, row_panels - r)
                    for c in range(0, col_panels, cols) for r in range(0, row_panels, rows)), reverse=True)
    loads = [0] * threads
    for size in sizes:
        loads[loads.index(min(loads))] += size
    return max(loads)


def _blocked(a: ir.Value, b: ir.Value, ta: bool, tb: bool, parallel: bool, swapped: bool,
             tasks: tuple[int, int] | None = None, block_width: int | None = None, number: int = 0,
             into: ir.Value | None = None, k_ranges: tuple[int, int, int] | None = None,
             strided_columns: bool = False, column_tasks: bool = False, kc: int | None = None,
             factors: tuple[Update | None, Update | None] = (None, None)) -> ir.Value:
    """op(A) @ op(B) GotoBLAS-style: A packed as row panels [mb, k, tm], B as column
    panels [nb, k, tn] (static operands that allow it read in place instead: ``_rows_in_place``,
    ``_columns_in_place``), a generic over (column panel, row panel, row, column, k) into a
    zero-filled [mb, tm, nb, tn] accumulator (tagged for the schedule), read back as the
    (m, n) corner of its (mb * tm, nb * tn) view: every register block is whole, and static
    rows are spread evenly over the blocks (``_even_block_rows``). ``swapped``: C^T of a product
    with few columns (``_swapping``), whose tasks split its columns only. ``tasks``: (column,
    row) panels per task instead of the default (``balanced_tasks``). ``block_width``: the
    register blocks' columns when not the default (``block_columns``). ``number``: the product's own
    number (``_padded_rows``). ``into``: a parameter (m, n) that the product is added to in place,
    ``_accumulated_into``. ``k_ranges``: one task loop of ranges of k (the batch) or of tiles of C,
    chosen at run time (``_summed_in_tasks``). ``strided_columns``: B is read in place though its rows
    are far apart (``_strided_columns``). ``column_tasks``: on threads in tasks of column panels only
    (``_column_tasks``). ``kc``: the depth of its slices of k when not ``cache_blocks``' (``_slice_depth``).
    ``factors``: an SGD update (of ``into``) whose factor scales A, or B, as it is packed (a scaled copy
    first where that operand is read in place)."""
    element = ir.RankedTensorType(a.type).element_type
    tm, wide = register_block(_itemsize(a))
    tn = block_width or wide
    a_factor, b_factor = factors
    tm, columns = (tm, None) if swapped or a_factor is not None else _image_panels(a, ta, tm)
    a_map, b_map = dims_map(5, [1, 4, 2]), dims_map(5, [0, 4, 3])
    in_place = None if swapped or columns is not None else _rows_in_place(a, ta, tm, dim_sizes(b)[0 if tb else 1])
    if in_place is not None and a_factor is not None:
        a, a_factor = scaled(a, a_factor), None
    padded_rows = (None if in_place is not None or swapped or columns is not None or a_factor is not None
                   else _padded_rows(a, ta, tm, number))
    if in_place is not None:  # A (m, k) viewed as [m / tm, tm, k]; A stored (k, m) as [k, m / tm, tm]
        tm, (k, m) = in_place, dim_sizes(a) if ta else reversed(dim_sizes(a))
        if ta:
            packed_a, a_map = _expand(a, [k, m // tm, tm], [[0], [1, 2]]), dims_map(5, [4, 1, 2])
        else:
            packed_a, a_map = _expand(a, [m // tm, tm, k], [[0, 1], [2]]), dims_map(5, [1, 2, 4])
    elif padded_rows is not None:  # A's rows in a buffer of whole row panels: [ceil(m / tm), tm, k]
        m, k = dim_sizes(a)
        packed_a, a_map = _expand(padded_rows, [_ceil_div(m, tm), tm, k], [[0, 1], [2]]), dims_map(5, [1, 2, 4])
    elif columns is None:
        m = dim_sizes(a)[1 if ta else 0]
        if isinstance(m, int):
            tm = _even_block_rows(m, tm)
        packed_a = _panels(a, 1 if ta else 0, tm, parallel, PACK_ROWS_A, a_factor)
    else:
        packed_a = im2col_panels(columns, tm)
        m = _times(dim_sizes(packed_a)[0], tm)  # (the columns go)
    n = dim_sizes(b)[0 if tb else 1]
    pixels = None if b_factor is not None else _pixel_panels(b, tb, tn) if swapped else _padded_columns(b, tb, tn)
    if pixels is not None:  # a convolution's columns [k, column panel, column]
        packed_b, b_map = pixels, dims_map(5, [4, 0, 3])
    elif not swapped and (strided_columns or _columns_in_place(b, tb, tn)):  # B (k, n) viewed as [k, n / tn, tn]
        b = b if b_factor is None else scaled(b, b_factor)
        packed_b, b_map = _expand(b, [dim_sizes(b)[0], n // tn, tn], [[0], [1, 2]]), dims_map(5, [4, 0, 3])
    else:
        rows_tag = PACK_ROWS_B if tn == wide else PACK_ROWS_B_NARROW
        packed_b = _panels(b, 0 if tb else 1, tn, parallel, rows_tag, b_factor)
    row_panels, col_panels = _ceil_div(m, tm), _ceil_div(n, tn)
    # dims (column panel, row panel, row, column, k): the tasks' row blocks vary fastest
    maps = [a_map, b_map, dims_map(5, [1, 2, 0, 3])]
    fastmath = ir.Attribute.parse("#arith.fastmath<contract>")

    def added_into(a_panels: ir.Value, acc: ir.Value, b_panels: ir.Value | None = None,
                   columns_only: bool = False) -> ir.Value:
        """acc + the product of ``a_panels`` (A's row panels) and B (``b_panels`` of it, one task's:
        no threads), tagged for the schedule; ``columns_only``: its tasks split the columns only
        (one row panel)."""

        @linalg.generic([a_panels, packed_b if b_panels is None else b_panels], [acc], maps,
                        [PARALLEL] * 4 + [REDUCTION])
        def product(x: ir.Value, y: ir.Value, total: ir.Value) -> ir.Value:
            return arith.addf(total, arith.mulf(x, y, fastmath=fastmath), fastmath=fastmath)

        product.owner.attributes[PACKED] = ir.UnitAttr.get()
        if parallel and b_panels is None:
            one_column_task = isinstance(col_panels, int) and _one_column_task(col_panels, tn, _itemsize(a))
            tag = (PARALLEL_COLUMNS if swapped or column_tasks else PARALLEL_FINE if one_column_task
                   else PARALLEL_ROWS)
            value = ir.UnitAttr.get()
            if columns_only:
                tag = PARALLEL_COLUMNS
            elif tasks is not None:
                tag, value = PARALLEL_TASKS, ir.DenseI64ArrayAttr.get(list(tasks))
            product.owner.attributes[tag] = value
        depth = kc or cache_blocks(_itemsize(a))[2]
        product.owner.attributes[KC_DEPTH] = ir.DenseI64ArrayAttr.get([depth])
        return product

    if into is not None:
        return _accumulated_into(into, packed_a, tm, tn, added_into)
    if k_ranges is not None:
        partials = tensor.empty([k_ranges[2], *_static([row_panels, tm, col_panels, tn])], element)
        # below the switch, the tasks the tagged product gets: ``tasks``, else the schedule's default tiles
        nc = cache_blocks(_itemsize(a))[1]
        tiles = tasks or (nc // wide, _task_row_panels(_itemsize(a), _one_column_task(col_panels, tn, _itemsize(a))))
        dims = [_operand_dims(a_map), _operand_dims(b_map)]
        product = _summed_in_tasks([packed_a, packed_b], [dims[0].index(4), dims[1].index(4)],
                                   (dims[0].index(1), dims[1].index(0)), tiles, partials, k_ranges, added_into)
    else:
        acc = _zeros([row_panels, tm, col_panels, tn], element)
        acc.owner.attributes[ACC_INIT] = ir.UnitAttr.get()
        product = added_into(packed_a, acc)
    padded = [_times(row_panels, tm), _times(col_panels, tn)]
    kind = ir.RankedTensorType.get(_static(padded), element)
    flat = tensor.collapse_shape(kind, product, [[0, 1], [2, 3]])
    if all(isinstance(d, int) for d in (m, n)) and (m, n) == tuple(padded):
        return flat
    return _slice(flat, [m, n])


def _ranged(x: ir.Value, axis: int, start: ir.Value, count: ir.Value) -> ir.Value:
    """``x`` sliced to [start, start + count) along its dim ``axis``."""
    offsets: list[int | ir.Value] = [0] * len(dim_sizes(x))
    offsets[axis] = start
    sizes = dim_sizes(x)
    sizes[axis] = count
    return _part(x, offsets, sizes)


def _summed_in_tasks(operands: list[ir.Value], k_axes: list[int], panel_axes: tuple[int, int],
                     tiles: tuple[int, int], partials: ir.Value, k_ranges: tuple[int, int, int],
                     added_into: Callable[..., ir.Value]) -> ir.Value:
    """The product of the packed ``operands`` (A's row panels, B's column panels; k, the batch,
    along their dims ``k_axes``, their panels along ``panel_axes``) as one ``scf.forall`` whose
    tasks are chosen at run time. From a batch of ``k_ranges[1]`` rows, equal ranges of k of at
    least ``k_ranges[0]`` rows (2 to ``k_ranges[2]``), each summed into a partial accumulator of its
    own (of ``partials``, [k_ranges[2], *C's shape]): the runtime gives the calling thread the first half
    of the tasks first (``task_runtime.c``), so each thread sums the rows it packed. Below, one range in tiles of C of
    ``tiles`` (column panels, row panels), the tasks that the tagged product gets. The other
    partials are added to the first at the end (``partials_added``: no pass with one range). One
    product is built (and compiled) for both."""
    index = ir.IndexType.get()

    def const(value: int) -> ir.Value:
        return arith.constant(index, value)

    def chosen(many: ir.Value, few: ir.Value, above: ir.Value, below: int) -> ir.Value:
        """``above`` from the switch on, else ``below`` (index arithmetic only: it stays in the step)."""
        return arith.addi(arith.muli(many, above), arith.muli(few, const(below)))

    shape = list(ir.RankedTensorType(partials.type).shape)[1:]
    kind, rank = ir.RankedTensorType.get(shape, ir.RankedTensorType(partials.type).element_type), len(shape)
    panels = (shape[0], shape[2])  # C's row and column panels
    per_task = (min(tiles[1], panels[0]), min(tiles[0], panels[1]))
    counts = [-(-p // t) for p, t in zip(panels, per_task)]
    rows_min, batch_min, ranges_max = k_ranges
    k = tensor.dim(operands[0], const(k_axes[0]))
    many = arith.minui(arith.divui(k, const(batch_min)), const(1))  # 1 from batch_min rows, else 0
    few = arith.subi(const(1), many)
    in_ranges = arith.maxui(arith.minui(arith.divui(k, const(rows_min)), const(ranges_max)), const(1))
    ranges = chosen(many, few, in_ranges, 1)
    widths = [chosen(many, few, const(p), t) for p, t in zip(panels, per_task)]  # panels per task
    row_groups, col_groups = (chosen(many, few, const(1), c) for c in counts)
    groups = arith.muli(row_groups, col_groups)
    rows = arith.ceildivui(k, ranges)
    forall = scf.ForallOp([0], [arith.muli(ranges, groups)], [1], [partials])
    with ir.InsertionPoint(forall.body):
        task = forall.induction_variables[0]
        part, grouped = arith.divui(task, groups), arith.remui(task, groups)
        start = arith.muli(part, rows)
        count = arith.minui(rows, arith.subi(k, start))
        sliced = [_ranged(x, axis, start, count) for x, axis in zip(operands, k_axes)]
        offsets: list[int | ir.Value] = [part] + [0] * rank
        sizes: list[int | ir.Value] = [1, *shape]
        slot_sizes = list(shape)
        # the column group outermost, as the tagged product's tasks
        for which, (group, acc_axis) in enumerate(((arith.remui(grouped, row_groups), 0),
                                                    (arith.divui(grouped, row_groups), 2))):
            first = arith.muli(group, widths[which])
            width = arith.minui(widths[which], arith.subi(const(panels[which]), first))
            sliced[which] = _ranged(sliced[which], panel_axes[which], first, width)
            offsets[1 + acc_axis], sizes[1 + acc_axis], slot_sizes[acc_axis] = first, width, _DYNAMIC
        slot_kind = ir.RankedTensorType.get(slot_sizes, kind.element_type)
        slot = _sliced(slot_kind, forall.inner_iter_args[0], offsets, sizes)
        zeros = linalg.fill(arith.constant(kind.element_type, 0.0), outs=[slot])
        zeros.owner.attributes[ACC_INIT] = ir.UnitAttr.get()
        done = added_into(sliced[0], zeros, sliced[1])
        with ir.InsertionPoint(forall.terminator().block):
            tensor.parallel_insert_slice(done, forall.inner_iter_args[0], _dynamic(offsets), _dynamic(sizes), [],
                                         _static_or_dynamic(offsets), _static_or_dynamic(sizes), [1] * (rank + 1))
    summed = forall.results[0]
    head = _sliced(kind, summed, [0] * (rank + 1), [1, *shape])
    others = _sliced(ir.RankedTensorType.get([_DYNAMIC, *shape], kind.element_type), summed, [1] + [0] * rank,
                     [arith.subi(ranges, const(1)), *shape])
    total = partials_added(others, head)
    total.owner.attributes[PARTIALS_SUM] = ir.UnitAttr.get()
    return total


def _dynamic(values: list[int | ir.Value]) -> list[ir.Value]:
    """The run-time entries of a slice's offsets or sizes."""
    return [v for v in values if isinstance(v, ir.Value)]


def _static_or_dynamic(values: list[int | ir.Value]) -> list[int]:
    """The static entries of a slice's offsets or sizes, dynamic ones as the dynamic marker."""
    return [v if isinstance(v, int) else _DYNAMIC for v in values]


def _sliced(kind: ir.Type, x: ir.Value, offsets: list[int | ir.Value], sizes: list[int | ir.Value]) -> ir.Value:
    """The slice of ``x`` at ``offsets`` of ``sizes`` (unit strides), of type ``kind`` (rank-reduced)."""
    return tensor.extract_slice(kind, x, _dynamic(offsets), _dynamic(sizes), [], _static_or_dynamic(offsets),
                                _static_or_dynamic(sizes), [1] * len(sizes))


def _accumulated_into(into: ir.Value, packed_a: ir.Value, tm: int, tn: int,
                      added_into: Callable[..., ir.Value]) -> ir.Value:
    """``into`` (m, n) plus the product, in place: the register blocks of its whole row panels
    start from ``into`` itself, viewed as [m / tm, tm, n / tn, tn] (n a multiple of tn), and the
    few rows after them (m not a multiple of tm) are one zero-started panel, added to ``into``'s
    last rows (``packed_a`` is then packed: its row panels are its dim 0)."""
    m, n = _static_shape(into)
    element = ir.RankedTensorType(into.type).element_type
    whole, rest = m // tm, m % tm
    if rest:  # (the old last rows are read before the product writes into ``into``)
        a_sizes = dim_sizes(packed_a)
        tail_acc = _zeros([1, tm, n // tn, tn], element)
        tail_acc.owner.attributes[ACC_INIT] = ir.UnitAttr.get()
        tail = added_into(_part(packed_a, [whole, 0, 0], [1, *a_sizes[1:]]), tail_acc, columns_only=True)
        tail_rows = _slice(tensor.collapse_shape(ir.RankedTensorType.get([tm, n], element), tail, [[0, 1], [2, 3]]),
                           [rest, n])
        identity = dims_map(2, [0, 1])

        @linalg.generic([_part(into, [whole * tm, 0], [rest, n]), tail_rows], [_empty([rest, n], element)],
                        [identity] * 3, [PARALLEL] * 2)
        def last_rows(old: ir.Value, added: ir.Value, _out: ir.Value) -> ir.Value:
            return arith.addf(old, added)

        packed_a = _part(packed_a, [0, 0, 0], [whole, *a_sizes[1:]])
    target = _part(into, [0, 0], [whole * tm, n]) if rest else into
    done = added_into(packed_a, _expand(target, [whole, tm, n // tn, tn], [[0, 1], [2, 3]]))
    flat = tensor.collapse_shape(ir.RankedTensorType.get([whole * tm, n], element), done, [[0, 1], [2, 3]])
    if not rest:
        return flat
    return _put(last_rows, _put(flat, into, [0, 0], [whole * tm, n]), [whole * tm, 0], [rest, n])


def _pixel_panels(b: ir.Value, tb: bool, tn: int) -> ir.Value | None:
    """The B operand of a swapped product (``b`` read transposed: C^T = W @ columns^T) when it is
    a convolution's columns: gathered pixel-major from the image (``pixel_panels``), which the
    product reads as its column panels. Transposing the (N * P * Q, C * KH * KW) columns into
    panels took longer than the product (LeNet-5's second convolution at batch 256: 10% of the
    step, the product 7%). Else None."""
    columns = im2col_source(b) if tb else None
    return None if columns is None else pixel_panels(columns, tn)


def _padded_columns(b: ir.Value, tb: bool, tn: int) -> ir.Value | None:
    """The B operand of a product over pixels (a weight gradient: dW = G^T @ columns) when it
    is a convolution's columns: gathered into pixel rows padded to whole column panels
    (``padded_columns``), which the product reads in place. Packing the columns into panels
    took longer than the product (LeNet-5's second convolution at batch 256: 10% of the step,
    the product 6%, the columns' gather 3.5%). Else None."""
    columns = None if tb else im2col_source(b)
    return None if columns is None else padded_columns(columns, tn)


def _rows_in_place(a: ir.Value, ta: bool, tm: int, n: int | ir.Value) -> int | None:
    """Rows per register block when op(A), its m static, is read in place instead of packed:
    the largest divisor of m over ``tm`` / 2 and at most ``tm`` (every block whole, none so short
    that its FMA chains starve), else None. A (m, k) is read as [m / tm, tm, k], each A[i, k] a
    broadcast from its row; A stored (k, m) as [k, m / tm, tm], a block's A[:, k] one contiguous
    run, as in a packed panel, when its rows are at most IN_PLACE_STRIDE_MAX apart. Over a
    dynamic k (a weight gradient's batch), blocks shorter than ``tm`` only where the product has
    at most IN_PLACE_SHORT_COLUMNS_MAX columns ``n`` (see there)."""
    m, k = reversed(_static_shape(a)) if ta else _static_shape(a)
    if m is None or ta and m * _itemsize(a) > IN_PLACE_STRIDE_MAX:
        return None
    rows = next((rows for rows in range(tm, tm // 2, -1) if m % rows == 0), None)
    short = rows is not None and rows < tm and k is None
    return None if short and not (isinstance(n, int) and 0 <= n <= IN_PLACE_SHORT_COLUMNS_MAX) else rows


def _padded_rows(a: ir.Value, ta: bool, tm: int, number: int) -> ir.Value | None:
    """A (m, k) of a product over a dynamic batch m, in a buffer of whole row panels that the
    product reads in place instead of packing A: when A is the one result of an element-wise
    generic (an epilogue, an activation's gradient) that writes into a fresh tensor in the
    product's block, that generic writes into the first m rows of a (ceil(m / tm) * tm, k)
    buffer instead, whose last few rows are zeroed; rows at most IN_PLACE_STRIDE_MAX bytes apart
    (a register block's rows 4 KB apart fall on one set of L1). Packing A took 6% of a 100-wide Adam
    step at batch 5000 on two cores. The buffer carries ``number`` (PADDED_ROWS), so that CSE does not merge
    the buffers of equal shapes into one, which bufferization then copies apart. Else None."""
    producer = a.owner
    if ta or isinstance(producer, ir.Block) or producer.name != "linalg.generic" or len(producer.results) != 1:
        return None
    m, k = _static_shape(a)
    init = producer.operands[len(producer.operands) - 1]
    fresh = init.owner
    if (m is not None or k is None or k * _itemsize(a) > IN_PLACE_STRIDE_MAX or isinstance(fresh, ir.Block)
            or fresh.name != "tensor.empty"
            or len(list(init.uses)) != 1 or producer.parent != ir.InsertionPoint.current.block.owner
            or any(str(kind) != "#linalg.iterator_type<parallel>" for kind in producer.attributes["iterator_types"])):
        return None
    element = ir.RankedTensorType(a.type).element_type
    with ir.InsertionPoint(producer), producer.location:
        rows = fresh.operands[0]
        whole_rows = _times(_ceil_div(rows, tm), tm)
        buffer = bufferization.alloc_tensor(ir.RankedTensorType.get(_static([None, k]), element), [whole_rows])
        buffer.owner.attributes[PADDED_ROWS] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), number)
        producer.operands[len(producer.operands) - 1] = _part(buffer, [0, 0], [rows, k])
    written = producer.results[0]
    readers = list(written.uses)
    with ir.InsertionPoint.after(producer), producer.location:
        buffer = _put(written, buffer, [0, 0], [rows, k])
        rest = arith.subi(whole_rows, rows)
        zeros = linalg.fill(arith.constant(element, 0.0), outs=[_part(buffer, [rows, 0], [rest, k])])
        whole = _put(zeros, buffer, [rows, 0], [rest, k])
        # Its readers read the rows back from the whole buffer: read after the inserts, the producer's
        # result made bufferization write it elsewhere and copy it in.
        rows_read = _part(whole, [0, 0], [rows, k])
    for use in readers:
        use.owner.operands[use.operand_number] = rows_read
    return whole


def _columns_in_place(b: ir.Value, tb: bool, tn: int) -> bool:
    """Whether op(B) = B (k, n) is read in place as [k, n / tn, tn] instead of packed: both
    static, whole column panels, rows at most IN_PLACE_STRIDE_MAX apart and not a multiple of
    ALIASED_PITCH: a kc-deep slice of a column panel then falls on a few sets of an 8-way L1
    and is read from L2 again for every block of rows (on a Zen 3 host, the 784-256-10 step at
    batch 1024 and the 128-512-512-512-1 step at 256 ran 8.5% faster with such B packed)."""
    pitch = _panel_pitch(b, tb, tn)
    return pitch is not None and _pitch_in_place(pitch)


def _panel_pitch(b: ir.Value, tb: bool, tn: int) -> int | None:
    """The bytes between rows of op(B) = B (k, n) when it could be read in place as column panels
    (both static, whole panels of ``tn``), else None."""
    k, n = _static_shape(b)
    return None if tb or k is None or n is None or n % tn else n * _itemsize(b)


def _pitch_in_place(pitch: int) -> bool:
    """Whether rows ``pitch`` bytes apart read well in place: at most IN_PLACE_STRIDE_MAX and not a
    multiple of ALIASED_PITCH (``_columns_in_place``)."""
    return pitch <= IN_PLACE_STRIDE_MAX and pitch % ALIASED_PITCH != 0


def _static_shape(x: ir.Value) -> list[int | None]:
    """The sizes of ``x``'s type, None for a dynamic one (no ops emitted)."""
    return [None if ir.ShapedType.is_dynamic_size(d) else d for d in ir.RankedTensorType(x.type).shape]


def _itemsize(x: ir.Value) -> int:
    return ir.FloatType(ir.RankedTensorType(x.type).element_type).width // 8


def _image_panels(a: ir.Value, ta: bool, tm: int) -> tuple[int, ir.Operation | None]:
    """(rows per register block, the IM2COL copy to pack A's panels from) of a product's A:
    a convolution's columns whose output rows split into whole panels are packed straight from
    the image (``im2col_panels``), in panels of ``panel_rows``; else (``tm``, None)."""
    columns = None if ta else im2col_source(a)
    if columns is None:
        return tm, None
    rows = panel_rows(ir.RankedTensorType(columns.result.type).shape[2], tm)
    return (tm, None) if rows is None else (rows, columns)


def _epilogues_into_fresh_tensors(product: ir.Value) -> None:
    """Element-wise ops that write over a blocked product (an epilogue's ``init``) write
    into a fresh tensor instead: over the padded accumulator's corner, bufferization first
    copies the product into the result buffer, a serial pass over the whole output (and,
    for an update, a second one into the parameter). The op never reads its init."""
    for use in list(product.uses):
        op = use.owner
        if op.name != "linalg.generic" or use.operand_number < len(op.operands) - len(op.results):
            continue
        body = op.regions[0].blocks[0]
        if list(body.arguments[use.operand_number].uses):
            continue
        updated = updated_input(op)
        if updated is not None:  # read and written through the init: no copy of the parameter
            body.arguments[updated].replace_all_uses_with(body.arguments[use.operand_number])
            op.operands[use.operand_number] = op.operands[updated]
            continue
        element = ir.RankedTensorType(product.type).element_type
        with ir.InsertionPoint(op), op.location:
            op.operands[use.operand_number] = _empty(dim_sizes(product), element)


def _schedule_text(itemsize: int, tasks: Iterable[tuple[int, int]] = (),
                   chunks: Iterable[tuple[str, tuple[int, ...]]] = (),
                   splits: Iterable[tuple[int, int]] = (), small_tasks: Iterable[int] = (),
                   thread_count: int | None = None, quick: bool = False,
                   block_splits: Iterable[tuple[int, int]] = (),
                   chunk_splits: Iterable[tuple[int, int]] = (), depths: Iterable[int] = (),
                   row_blocks: Iterable[int] = ()) -> str:
    """The schedule's text for products of ``itemsize`` bytes with these tags (``depths``: their kc
    slices'; ``row_blocks``: their SMALL_ROWS blocks'); ``quick``: the quick tier's (QUICK_K_UNROLL,
    QUICK_SMALL_K_STEP)."""
    tm, tn = register_block(itemsize)
    _, nc, kc = cache_blocks(itemsize)
    sizes = {"tm": tm, "tm_lanes": 1 << (tm - 1).bit_length(), "tn": tn, "tn_narrow": tn // 2,
             "row_panels": _task_row_panels(itemsize, False), "fine_row_panels": _task_row_panels(itemsize, True),
             "col_panels": nc // tn,
             "kc": kc, "tile": TRANSPOSE_TILE, "rows": PACK_ROWS_STEP, "swapped_panels": SWAPPED_TASK_PANELS,
             "small_k_step": QUICK_SMALL_K_STEP if quick else SMALL_K_STEP,
             "k_unroll": QUICK_K_UNROLL if quick else K_UNROLL,
             "row_block_k_step": ROW_BLOCK_K_STEP, "pack_task_rows": PACK_TASK_ROWS,
             "pack_group_tasks": (f"num_threads [0, {thread_count}]" if thread_count
                                  else f"tile_sizes [0, {PACK_TASK_ROWS // PACK_ROWS_STEP}]")}
    text = (shipped_dir() / SCHEDULE).read_text()
    for name, value in sizes.items():
        text = text.replace("{" + name + "}", str(value))
    text = text.replace("{small_chunks}", "".join(_chunk_section(*c) for c in sorted(chunks)))
    text = text.replace("{lane_splits}", "".join(_split_section(s) for s in sorted(splits)))
    text = text.replace("{chunk_splits}", "".join(_split_section(s, SPLIT_LANES_IN_CHUNKS, label="chunks")
                                                  for s in sorted(chunk_splits)))
    for loop in ("whole", "rest"):
        sections = "".join(_split_section(s, SPLIT_LANES_IN_BLOCKS, f"{loop}_loop") for s in sorted(block_splits))
        text = text.replace("{" + loop + "_splits}", sections)
    text = text.replace("{small_tasks}", "".join(_SMALL_TASKS.replace("{rows}", str(r)) for r in sorted(small_tasks)))
    text = text.replace("{small_row_blocks}",
                        _merged_sections(_ROW_BLOCKS, "rows", set(row_blocks) | {SMALL_ROW_BLOCK}, "block_loop"))
    text = text.replace("{kc_slices}", _merged_sections(_KC_SLICES, "kc", set(depths) | {kc}, "slices"))
    return text.replace("{balanced_tasks}", "".join(_balanced_section(t) for t in sorted(tasks)))


# a loop over the equal chunks (tile sizes) of the products tagged SMALL_CHUNK with these, or
# tasks of them (SMALL_CHUNK_TASKS)
_CHUNK_LOOP = """    %chunked_{name} = transform.structured.match ops{["linalg.generic"]}
        attributes {{tag} = array<i64: {tiles}>} in %root : (!transform.any_op) -> !transform.any_op
    %chunk_{name}, %chunk_loop_{name} = transform.structured.{tiling} %chunked_{name}
        tile_sizes [{tiles}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
"""


def _chunk_section(tag: str, tiles: tuple[int, ...]) -> str:
    tasks = tag == SMALL_CHUNK_TASKS
    name = ("tasks_" if tasks else "") + "_".join(map(str, tiles))
    return (_CHUNK_LOOP.replace("{name}", name).replace("{tag}", tag).replace("{tiles}", ", ".join(map(str, tiles)))
            .replace("{tiling}", "tile_using_forall" if tasks else "tile_using_for"))


# the two parts of the small products tagged SPLIT_LANES with this (loop, point), or SPLIT_LANES_IN_BLOCKS
# in each of their whole or rest blocks of rows (the handle ``within``)
_SPLIT = """    %{label}_split_{name} = transform.structured.match ops{["linalg.generic"]}
        attributes {{tag} = array<i64: {dim}, {point}>} in %{within} : (!transform.any_op) -> !transform.any_op
    %{label}_split_parts_{name} = transform.structured.split %{label}_split_{name} after {point}
        {dimension = {dim}} : !transform.any_op
"""


def _split_section(split: tuple[int, int], tag: str = SPLIT_LANES, within: str = "root", label: str = "") -> str:
    """The split of the products tagged ``tag`` with ``split`` (loop, point) in the handle ``within``;
    ``label`` names its handles (default: ``within``)."""
    dim, point = split
    return (_SPLIT.replace("{label}", label or within).replace("{within}", within).replace("{tag}", tag)
            .replace("{name}", f"{dim}_{point}").replace("{dim}", str(dim)).replace("{point}", str(point)))


# tasks of products tagged PARALLEL_TASKS with these sizes (their zero fills: as the others')
_BALANCED = """    %tasks_{c}_{r} = transform.structured.match ops{["linalg.generic"]}
        attributes {mlirnn.packed, mlirnn.parallel_tasks = array<i64: {c}, {r}>} in %root
        : (!transform.any_op) -> !transform.any_op
    %task_chunks_{c}_{r}, %task_forall_{c}_{r} = transform.structured.tile_using_forall %tasks_{c}_{r}
        tile_sizes [{c}, {r}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
"""


# kc slices of the packed products tagged KC_DEPTH with this depth (merged into %slices)
_KC_SLICES = """    %packed_{kc} = transform.structured.match ops{["linalg.generic"]}
        attributes {mlirnn.packed, mlirnn.kc = array<i64: {kc}>} in %root : (!transform.any_op) -> !transform.any_op
    %slices_{kc}, %k_blocks_{kc} = transform.structured.tile_using_for %packed_{kc} tile_sizes [0, 0, 0, 0, {kc}]
        : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    transform.annotate %k_blocks_{kc} "mlirnn.kc_loop" : !transform.any_op
"""


def _merged_sections(template: str, key: str, values: Iterable[int], handle: str) -> str:
    """``template`` once per value in ``values`` (``{key}`` replaced by it), the handles
    ``%{handle}_{value}`` they define merged into ``%{handle}``."""
    values = sorted(values)
    merged = ", ".join(f"%{handle}_{v}" for v in values)
    return ("".join(template.replace("{" + key + "}", str(v)) for v in values)
            + f"    %{handle} = transform.merge_handles {merged} : !transform.any_op\n")


def _balanced_section(tasks: tuple[int, int]) -> str:
    return _BALANCED.replace("{c}", str(tasks[0])).replace("{r}", str(tasks[1]))


# blocks of the products tagged SMALL_ROWS with this many rows (their loops merged into %block_loop)
_ROW_BLOCKS = """    %blocked_{rows} = transform.structured.match ops{["linalg.generic"]}
        attributes {mlirnn.small_rows = array<i64: {rows}>} in %root : (!transform.any_op) -> !transform.any_op
    %row_blocks_{rows}, %block_loop_{rows} = transform.structured.tile_using_for %blocked_{rows}
        tile_sizes [{rows}, 0, 0] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
"""


# tasks of the products tagged SMALL_TASKS with this many rows
_SMALL_TASKS = """    %small_tasks_{rows} = transform.structured.match ops{["linalg.generic"]}
        attributes {mlirnn.small_tasks = array<i64: {rows}>} in %root : (!transform.any_op) -> !transform.any_op
    %small_task_{rows}, %small_forall_{rows} = transform.structured.tile_using_forall %small_tasks_{rows}
        tile_sizes [{rows}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
"""


@dataclass
class _Tags:
    """The distinct schedule tags of the products of a module: PARALLEL_TASKS sizes, SMALL_TASKS
    row counts, (SMALL_CHUNK or SMALL_CHUNK_TASKS, tile sizes), SPLIT_LANES and
    SPLIT_LANES_IN_BLOCKS (loop, point), KC_DEPTH depths, SMALL_ROWS rows per block."""

    tasks: set[tuple[int, int]]
    small_tasks: set[int]
    chunks: set[tuple[str, tuple[int, ...]]]
    splits: set[tuple[int, int]]
    block_splits: set[tuple[int, int]]
    chunk_splits: set[tuple[int, int]]
    depths: set[int]
    row_blocks: set[int]


def _schedule_tags(module: ir.Module) -> _Tags:
    """Every tag of ``_Tags`` in one walk that skips the bodies of linalg ops (the tagged ops are
    linalg.generic ops; their bodies hold most of a module's ops). Five walks of the whole
    module before: a tenth of a second at 16x256 Adam."""
    tags = _Tags(set(), set(), set(), set(), set(), set(), set(), set())

    def visit(op: ir.Operation) -> ir.WalkResult:
        if not op.name.startswith("linalg."):
            return ir.WalkResult.ADVANCE
        if op.name == "linalg.generic":
            attributes = op.attributes
            if PARALLEL_TASKS in attributes:
                tags.tasks.add(tuple(ir.DenseI64ArrayAttr(attributes[PARALLEL_TASKS])))
            if SMALL_TASKS in attributes:
                tags.small_tasks.add(ir.DenseI64ArrayAttr(attributes[SMALL_TASKS])[0])
            for tag in (SMALL_CHUNK, SMALL_CHUNK_TASKS):
                if tag in attributes:
                    tags.chunks.add((tag, tuple(ir.DenseI64ArrayAttr(attributes[tag]))))
            if SPLIT_LANES in attributes:
                tags.splits.add(tuple(ir.DenseI64ArrayAttr(attributes[SPLIT_LANES])))
            if SPLIT_LANES_IN_BLOCKS in attributes:
                tags.block_splits.add(tuple(ir.DenseI64ArrayAttr(attributes[SPLIT_LANES_IN_BLOCKS])))
            if SPLIT_LANES_IN_CHUNKS in attributes:
                tags.chunk_splits.add(tuple(ir.DenseI64ArrayAttr(attributes[SPLIT_LANES_IN_CHUNKS])))
            if KC_DEPTH in attributes:
                tags.depths.add(ir.DenseI64ArrayAttr(attributes[KC_DEPTH])[0])
            if SMALL_ROWS in attributes:
                tags.row_blocks.add(ir.DenseI64ArrayAttr(attributes[SMALL_ROWS])[0])
        return ir.WalkResult.SKIP

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return tags


def _apply_schedule(module: ir.Module, itemsize: int, thread_count: int | None, quick: bool) -> None:
    # imported when a schedule runs (3 ms: none does in the quick tier, whose products call the C GEMM)
    from mlir.dialects.transform import interpreter

    tags = _schedule_tags(module)
    text = _schedule_text(itemsize, tags.tasks, tags.chunks, tags.splits, tags.small_tasks, thread_count, quick,
                          tags.block_splits, tags.chunk_splits, tags.depths, tags.row_blocks)
    schedule = ir.Module.parse(text, module.context)
    entry = next(op for op in schedule.body.operations
                 if ir.StringAttr(op.attributes["sym_name"]).value == "mlirnn_cpu_matmul")
    try:
        interpreter.apply_named_sequence(module.operation, entry, schedule)
    except ValueError as error:
        raise RuntimeError(f"codegen: the CPU matmul schedule {SCHEDULE} failed: {error}") from None


def rewrite_matmuls(module: ir.Module, threads: bool = True, batch_rows: int | None = None,
                    thread_count: int | None = None, quick: bool = False,
                    library: bool = False) -> tuple[int, int]:
    """Rewrite every linalg.matmul of ``module``: (blocked, looped) counts (a product with a
    short k is looped: one element-wise pass, ``short_products``). With ``threads``,
    products with enough work spread their blocks over threads, unless they run in a task
    already (large element-wise ops go on threads after bufferization: ``parallel_maps``).
    ``batch_rows``: the rows a dynamic batch is priced at (``product_plan``). ``thread_count``: the
    threads the step computes on, when known (a batch's row groups packed in one block a thread).
    ``quick``: the quick tier's schedule, less unrolled (QUICK_K_UNROLL, QUICK_SMALL_K_STEP), and
    no schedule for the sums over the batch (``row_sums``).
    ``library``: products that the C GEMM computes (``gemm_calls.library_product``) stay
    ``linalg.matmul`` (``gemm_calls.products_as_calls`` makes them calls once bufferized)."""
    matmuls = collect_linalg_ops(module, lambda op: op.name == "linalg.matmul"
                                 and not (library and library_product(op)))
    blocked, itemsize = 0, 4
    with module.context:
        for number, op in enumerate(matmuls):
            plan = product_plan(op, threads and not in_tasks(op), batch_rows=batch_rows)
            short, large = plan.kind == "short-k", plan.blocked
            update: Update | None = None
            if large:
                itemsize = _itemsize(op.result)
            with ir.InsertionPoint(op), op.location:
                if plan.rows is not None:
                    a, b, c = op.operands
                    replacement = row_block_product(a, b, c, *matmul_transposes(op), plan.rows,
                                                    ir.InsertionPoint(op.parent), _is_zero_fill(c))
                elif short:
                    a, b, _ = op.operands
                    replacement = short_product(a, b, *matmul_transposes(op), _sizes(op)[2])
                elif large:
                    update = update_of(op, plan)
                    replacement = _as_blocked(op, plan, number, update)
                else:
                    assert plan.loops is not None
                    replacement = _as_generic(op, plan.loops)
            if large and update is not None:  # the product is the update
                update.epilogue.results[0].replace_all_uses_with(replacement)
                update.epilogue.erase()
            op.result.replace_all_uses_with(replacement)
            op.erase()
            if short:
                fuse_into_epilogue(replacement)
            elif large and update is None:
                _epilogues_into_fresh_tensors(replacement)
            blocked += large
        drop_im2col_tags(module)
        # the quick tier's sums over the batch stay loops: their schedule's vector code cost its
        # compile 10-20 ms (Adam MLPs, batch 128: 1x16 0.210 -> 0.199 s, 4x256 0.299 -> 0.277 s)
        # and bought its steps nothing at -O0 (8x64 0.39 ms, 4x256 2.0 ms either way)
        sums = 0 if quick else tag_row_sums(module, threads)
        if matmuls or sums:
            _apply_schedule(module, itemsize, thread_count, quick)
            start_accumulators_at_zero(module)
    return blocked, len(matmuls) - blocked
