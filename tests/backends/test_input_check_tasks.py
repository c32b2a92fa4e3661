"""The compiled step's check of its inputs (NaN or infinity stops it) in tasks on threads.

An input of CHECK_TASK_ELEMENTS * 2 elements or more is checked in up to CHECK_TASKS_MAX tasks,
each over its own range of the flattened input: a bad element anywhere (first, last, at a task's
edge) is found, and a good input runs the step as before, at every batch."""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.backends.input_guard import CHECK_TASK_ELEMENTS, CHECK_TASKS_MAX
from mlir_nn.backends.task_runtime import teams_forked
from mlir_nn.ir import Graph, make_node

WIDTH = 300
ROWS = (1, 7, 13, 33, 257, 4099)


@pytest.fixture(scope="module")
def executable():
    """x (N, WIDTH) and y (N, 1): w <- w - sum over the batch of x * y (a parameter written in place)."""
    x = make_node("input", [], name="x", shape=("N", WIDTH), dtype="float32")
    y = make_node("input", [], name="y", shape=("N", 1), dtype="float32")
    w = make_node("param", [], name="w", shape=(WIDTH,), dtype="float32")
    update = make_node("sub", [w, make_node("sum_to", [make_node("mul", [x, y])], shape=(WIDTH,))])
    return CpuBackend().compile(Graph((x, y), (w,), (), updates=(("w", update),), name="checked"))


def _bad_positions(size: int) -> list[int]:
    """The first and last elements, and the edges of the tasks the check splits ``size`` into."""
    tasks = max(1, min(size // CHECK_TASK_ELEMENTS, CHECK_TASKS_MAX))
    per_task = -(-size // tasks)
    return sorted({0, size - 1, *(min(size - 1, t * per_task + d) for t in range(1, tasks) for d in (-1, 0))})


def test_a_large_input_is_checked_in_tasks():
    assert 4099 * WIDTH >= 2 * CHECK_TASK_ELEMENTS > 257 * WIDTH


@pytest.mark.parametrize("rows", ROWS)
def test_bad_elements_anywhere_stop_the_step_and_good_input_runs(executable, rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    y = rng.standard_normal((rows, 1)).astype(np.float32)
    w = rng.standard_normal(WIDTH).astype(np.float32)
    for position in _bad_positions(x.size):
        for value in (np.nan, -np.inf):
            bad = x.copy()
            bad.flat[position] = value
            kept = w.copy()
            before = teams_forked()
            with pytest.raises(ValueError, match="input x contains 1 NaN or infinite"):
                executable.run([bad, y], [kept])
            np.testing.assert_array_equal(kept, w)  # nothing written
            assert (teams_forked() > before) == (x.size >= 2 * CHECK_TASK_ELEMENTS), (rows, position)
    got = w.copy()
    executable.run([x, y], [got])
    want = w.astype(np.float64) - (x.astype(np.float64) * y).sum(0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
