"""A small sum over the batch split into tasks of row ranges, each into a partial sum of its own.

A weight gradient C (m, n) += A^T B over a dynamic batch of rows, with a small C (24 x 48),
runs as one loop over the batch that carries C's chunks in registers (``cpu_matmul``): at
batch 20000 it was a third of a 24-48-48-24 step, all of it on one core. Here the batch is
cut at run time into ``tasks`` = floor(batch / rows_min) equal ranges (1 to TASKS_MAX), an
``scf.forall``: each task computes the same product over its rows (at least ``rows_min``)
into a zeroed partial C of its own, and C plus the partials used is one pass at the end. A
batch under 2 * ``rows_min`` rows (the moons step's) is one task, which the step calls
directly (``backends.parallel_bodies``): no team of threads is forked. The partial sums
live in the step's workspace (TASKS_MAX of them, static). A sum in a loop over chunks of its
accumulator runs each task's rows in blocks that stay in cache while every chunk reads them
(``cpu_matmul._block_rows``).
"""

from __future__ import annotations

from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, scf, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import dims_map

TASKS_MAX = 8  # partial sums at most: tasks enough for a few cores, a workspace of TASKS_MAX * m * n
TASK_WORK_MIN = 1 << 19  # multiply-adds from which a task of its own pays (its queueing and partial sum)
_DYNAMIC = ir.ShapedType.get_dynamic_size()


def rows_per_task(row_work: int) -> int:
    """Batch rows of at least TASK_WORK_MIN multiply-adds (``row_work`` a row)."""
    return -(-TASK_WORK_MIN // row_work)


def _rows(x: ir.Value, start: ir.Value, count: ir.Value) -> ir.Value:
    """Rows [start, start + count) of the 2-D ``x``."""
    width = ir.RankedTensorType(x.type).shape[1]
    kind = ir.RankedTensorType.get([_DYNAMIC, width], ir.RankedTensorType(x.type).element_type)
    return tensor.extract_slice(kind, x, [start], [count], [], [_DYNAMIC, 0], [_DYNAMIC, width], [1, 1])


def sum_over_batch(xs: list[ir.Value], c: ir.Value, rows_min: int,
                   summed: Callable[..., ir.Value], block_rows: int | None = None) -> ir.Value:
    """C plus a sum over the rows of the (batch, ...) operands ``xs``, where ``summed(*rows,
    acc)`` builds acc plus the sum over their ``rows`` (acc shaped as C): the batch cut at
    run time into tasks of at least ``rows_min`` rows (one task for fewer), each into a partial
    sum of its own, added to C at the end; with ``block_rows``, each task's rows in blocks of
    that many, one after the other (``_in_blocks``)."""
    index = ir.IndexType.get()
    kind = ir.RankedTensorType(c.type)
    shape, rank = list(kind.shape), kind.rank
    batch = tensor.dim(xs[0], arith.constant(index, 0))
    whole = arith.divui(batch, arith.constant(index, rows_min))  # tasks of rows_min rows or more
    tasks = arith.maxui(arith.minui(whole, arith.constant(index, TASKS_MAX)), arith.constant(index, 1))
    rows = arith.ceildivui(batch, tasks)
    partials = tensor.empty([TASKS_MAX, *shape], kind.element_type)
    forall = scf.ForallOp([0], [tasks], [1], [partials])
    with ir.InsertionPoint(forall.body):
        task = forall.induction_variables[0]
        start = arith.muli(task, rows)
        count = arith.minui(rows, arith.subi(batch, start))
        slot = tensor.extract_slice(kind, forall.inner_iter_args[0], [task], [], [], [_DYNAMIC] + [0] * rank,
                                    [1, *shape], [1] * (rank + 1))
        zeros = linalg.fill(arith.constant(kind.element_type, 0.0), outs=[slot])
        if block_rows is None:
            done = summed(*[_rows(x, start, count) for x in xs], zeros)
        else:
            done = _in_blocks(xs, start, count, block_rows, zeros, summed)
        with ir.InsertionPoint(forall.terminator().block):
            tensor.parallel_insert_slice(done, forall.inner_iter_args[0], [task], [], [], [_DYNAMIC] + [0] * rank,
                                         [1, *shape], [1] * (rank + 1))
    used = tensor.extract_slice(ir.RankedTensorType.get([_DYNAMIC, *shape], kind.element_type), forall.results[0], [],
                                [tasks], [], [0] * (rank + 1), [_DYNAMIC, *shape], [1] * (rank + 1))
    return partials_added(used, c)


def _in_blocks(xs: list[ir.Value], start: ir.Value, count: ir.Value, block_rows: int, acc: ir.Value,
               summed: Callable[..., ir.Value]) -> ir.Value:
    """acc plus the sum over rows [start, start + count) of ``xs`` as a loop over blocks of
    ``block_rows`` rows (the last one shorter), each ``summed`` into the running total: a block
    that stays in L2 while a sum in chunks of its accumulator reads it once per chunk."""
    index = ir.IndexType.get()
    step = arith.constant(index, block_rows)
    loop = scf.ForOp(arith.constant(index, 0), count, step, [acc])
    with ir.InsertionPoint(loop.body):
        offset = loop.induction_variable
        rows = arith.minui(step, arith.subi(count, offset))
        first = arith.addi(start, offset)
        scf.yield_([summed(*[_rows(x, first, rows) for x in xs], loop.inner_iter_args[0])])
    return loop.results[0]


def partials_added(partials: ir.Value, c: ir.Value) -> ir.Value:
    """C plus the sum of the (tasks, *C's shape) ``partials``, the task loop outermost."""
    rank = ir.RankedTensorType(c.type).rank
    iterators = [linalg.IteratorType.reduction] + [linalg.IteratorType.parallel] * rank
    maps = [dims_map(rank + 1, list(range(rank + 1))), dims_map(rank + 1, list(range(1, rank + 1)))]

    @linalg.generic([partials], [c], maps, iterators)
    def added(part: ir.Value, acc: ir.Value) -> ir.Value:
        return arith.addf(acc, part)

    return added
