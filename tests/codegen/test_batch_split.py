"""Sums over the batch in partial sums of batch ranges (``batch_split``), against the reference.

The zoo's sums over the batch (x^T g, read directly and through a transpose node, and the two
gemms that subtract or scale it into a parameter) have accumulators of more than
SMALL_CARRY_MAX elements here, so each runs as tasks of batch ranges. The batches cover one
task, the most rows of one task, two, several with ranges of unequal length, and rows for
more than TASKS_MAX tasks (longer ranges): tolerances as test_cpu_matmul's.
"""

from __future__ import annotations

import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.batch_split import TASKS_MAX, rows_per_task
from mlir_nn.codegen.cpu_matmul import SMALL_CARRY_MAX, loop_plan, rewrite_matmuls
from mlir_nn.codegen.walk import collect_ops
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
