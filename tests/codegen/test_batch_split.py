"""Sums over the batch in partial sums of batch ranges (``batch_split``), against the reference.

The zoo's sums over the batch (x^T g, read directly and through a transpose node, and the two
gemms that subtract or scale it into a parameter) have accumulators of more than
SMALL_CARRY_MAX elements here, so each runs as tasks of batch ranges. The batches cover one
task, the most rows of one task, two, several with ranges of unequal length, and rows for
more than TASKS_MAX tasks (longer ranges): tolerances as test_cpu_matmul's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.batch_split import TASKS_MAX, rows_per_task
from mlir_nn.codegen.cpu_matmul import (
    L1_BLOCK_ROWS_MIN,
    SMALL_CARRY_MAX,
    SMALL_CHUNK_TASK_MIN,
    SMALL_ROW_BLOCK,
    SPLIT_TASK_ROWS_MIN,
    loop_plan,
    product_plan,
    rewrite_matmuls,
)
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.cpu_target import data_cache_bytes
from mlir_nn.support.schedule_rates import use_rates
from tests.codegen.test_cpu_matmul import NO_BLOCKS, _assert_matches_reference
from tests.codegen.zoo import matmul_zoo

SUMS = 4  # the zoo's sums over the batch: x^T g, transpose(x) g, and two gemms


@pytest.mark.parametrize("k, m, dtype", [(48, 24, "float32"), (24, 13, "float64"), (17, 33, "float32")])
def test_sums_over_the_batch_in_partial_sums_match_the_reference(k, m, dtype):
    assert k * m > SMALL_CARRY_MAX
    graph = matmul_zoo(k, m, dtype)
    module = emit_linalg(graph)
    with use_rates(NO_BLOCKS):  # 13 float64 columns are ragged rows: blocked by default
        rewrite_matmuls(module)
        executable = CpuBackend().compile(graph)
    partials = f"tensor<{TASKS_MAX}x"  # a forall over batch ranges: its partial sums
    split = collect_ops(module, lambda op: op.name == "scf.forall" and str(op.results[0].type).startswith(partials))
    assert len(split) == SUMS
    rows = rows_per_task(k * m)
    batches = (1, rows, 2 * rows - 1, 2 * rows, 3 * rows + 5, TASKS_MAX * rows + 7, (TASKS_MAX + 1) * rows)
    _assert_matches_reference(graph, executable, batches, dtype)


def test_without_threads_or_with_a_small_accumulator_a_sum_stays_one_loop():
    for k, m, threads in ((48, 24, False), (8, 16, True)):
        graph = matmul_zoo(k, m, "float32")
        module = emit_linalg(graph)
        with module.context:
            plans = [loop_plan(op, threads) for op in collect_ops(module, lambda op: op.name == "linalg.matmul")]
        assert all(plan.split_rows is None for plan in plans)


@pytest.mark.parametrize("k, m, dtype", [(1000, 10, "float32"), (4096, 10, "float32"), (1024, 3, "float64"),
                                         (32, 32, "float32")])  # (rows of 256 bytes: blocks that fit L1)
def test_a_sum_in_chunks_over_a_long_batch_runs_in_partial_sums_of_blocks_that_fit_a_cache(k, m, dtype):
    """x^T g summed over the batch in a loop over chunks of its accumulator: priced at a batch that
    fills TASKS_MAX tasks of partial sums of SPLIT_TASK_ROWS_MIN rows or more (``Graph.batch_rows``),
    it runs in tasks of batch ranges whose rows go in blocks filling half of L1 (where that holds
    L1_BLOCK_ROWS_MIN rows) or of L2, each block read from cache by every chunk (as tasks of chunks,
    each read a strip of every row of x); priced at fewer rows, a large accumulator's chunks stay the
    tasks. It matches the reference at batches of one block, of several blocks with a short last one,
    and of TASKS_MAX tasks."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", m), dtype=dtype)
    rows = rows_per_task(k * m)
    fills = TASKS_MAX * max(rows, SPLIT_TASK_ROWS_MIN)  # the fewest batch rows priced as tasks of partial sums
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    long = graph.with_batch_rows(2 * fills)  # (rounded down to a power of two)
    module = emit_linalg(long)
    with module.context:
        (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
        short, plan = (product_plan(op, threads=True, batch_rows=priced) for priced in (fills - 1, long.batch_rows))
    assert plan.loops.chunk and not plan.loops.chunk_tasks and plan.loops.split_rows == rows, plan
    assert short.loops.chunk_tasks == (k * m >= SMALL_CHUNK_TASK_MIN), short
    itemsize = np.dtype(dtype).itemsize
    l1_rows, l2_rows = (data_cache_bytes()[level] // 2 // ((k + m) * itemsize) for level in (1, 2))
    block = (l1_rows if l1_rows >= L1_BLOCK_ROWS_MIN else l2_rows) // SMALL_ROW_BLOCK * SMALL_ROW_BLOCK
    assert (k == 32) == (l1_rows >= L1_BLOCK_ROWS_MIN)  # (L1 of 32 KiB or more)
    assert f"tasks of at least {rows} batch rows into partial sums in blocks of {block} rows" in plan.reason
    rewrite_matmuls(module, batch_rows=long.batch_rows)
    # (a loop to the task's row count, not the chunks' loop to k)
    blocks = re.findall(rf"scf.for %\w+ = %c0 to %(?!c\d)\w+ step %c(\d+) iter_args\(.*\) -> \(tensor<{k}x{m}x",
                        str(module))
    assert blocks == [str(block)], blocks
    executable = CpuBackend().compile(long)
    _assert_matches_reference(long, executable, (1, 7, 13, 33, 257, TASKS_MAX * block + 5, 4099), dtype)


@given(k=st.integers(9, 700), m=st.integers(1, 40), transposed=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]), priced=st.sampled_from([64, 1024, 16384]),
       batch=st.integers(1, 5000))
@settings(max_examples=12, deadline=None)
def test_random_sums_over_the_batch_in_chunks_match_the_reference(k, m, transposed, dtype, priced, batch):
    """Weight gradients of random sizes over a batch priced at few or many rows (so as chunk tasks,
    one loop, or tasks of partial sums in blocks of rows), in both layouts (x^T g and g^T x), as loop
    nests: they match the reference at a random batch."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", m), dtype=dtype)
    product = make_node("matmul", [g, x] if transposed else [x, g], transpose_a=True)
    graph = Graph((x, g), (), (product,), name="weights").with_batch_rows(priced)
    with use_rates(NO_BLOCKS):
        executable = CpuBackend().compile(graph)
    _assert_matches_reference(graph, executable, (batch,), dtype)
