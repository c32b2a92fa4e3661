"""Large matrix products whose row blocks run on the task runtime's threads, against the reference.

A product is split over threads when its work reaches ``PARALLEL_WORK_MIN`` at a batch
that fills one task (mc rows, or one kc slice as k);
each row block is computed by exactly one task, so results do not depend on the thread
count or the scheduling. Tolerances: float32 rtol 2e-4 / atol 2e-4 (sums of ~500 products
of unit normals cancel down to ~1e-2 at times), float64 as in test_cpu.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn.backends.cpu import compile_kernel
from mlir_nn.backends.input_guard import CHECK_TASK_ELEMENTS
from mlir_nn.backends.reference import evaluate
from mlir_nn.backends.task_runtime import teams_forked
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.batch_split import TASKS_MAX, rows_per_task
from mlir_nn.codegen.cpu_matmul import PACK_ROWS_STEP, small_block_rows, small_task_rows
from mlir_nn.codegen.parallel_maps import PARALLEL_MAP_MIN, PARALLEL_MAP_ROWS
from mlir_nn.codegen.schedule_report import product_schedules
from mlir_nn.codegen.short_products import SHORT_K
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.cpu_target import cache_blocks, vector_bytes
from mlir_nn.support.schedule_rates import PARALLEL_WORK_MIN
from tests.backends.test_cpu import compiled, make_step
from tests.codegen.zoo import arguments, matmul_zoo

PARALLEL_FN = "omp.parallel"  # a row-block loop forked on the task runtime's threads
K, M = 517, 515  # odd sizes: k * m just above the threshold; 512 + 3 columns, rows of 12 plus a rest

TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float64": dict(rtol=1e-9, atol=1e-11)}


def check(graph, batch: int, seed: int) -> None:
    inputs, params = arguments(graph, batch, np.random.default_rng(seed))
    want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
    for node, got, expected in zip(graph.outputs, compiled(graph).run(inputs, params), want):
        assert got.shape == expected.shape and got.dtype == expected.dtype, node
        np.testing.assert_allclose(got, expected, **TOL[graph.inputs[0].dtype], err_msg=f"{node.op} batch {batch}")


def test_the_odd_sized_products_are_over_the_threshold():
    assert K * M >= PARALLEL_WORK_MIN > 181 * 197


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_parallel_products_match_the_reference(dtype):
    graph = matmul_zoo(K, M, dtype)
    assert PARALLEL_FN in compiled(graph).stages["llvm"]
    for batch in (1, 2, 11, 12, 13, 25, 100, 301):
        check(graph, batch, batch)


def _one_product(batch_rows: bool, k: int, m: int) -> Graph:
    """x @ w (the batch as rows) or x^T @ g (the batch as k: a weight gradient), x: (N, k)."""
    x = make_node("input", [], name="x", shape=("N", k), dtype="float32")
    if batch_rows:
        other = make_node("param", [], name="w", shape=(k, m), dtype="float32")
        return Graph((x,), (other,), (make_node("matmul", [x, other]),), name="rows")
    other = make_node("input", [], name="g", shape=("N", m), dtype="float32")
    return Graph((x, other), (), (make_node("matmul", [x, other], transpose_a=True),), name="weights")


def _schedule(graph: Graph) -> str:
    """The schedule of the one product of ``graph`` (``cpu_matmul.product_plan``)."""
    (product,) = product_schedules(emit_linalg(graph, wide_sums=True), batch_rows=graph.batch_rows)
    return product.schedule


@pytest.mark.parametrize("batch_rows", [True, False])
def test_small_products_queue_tasks_only_for_a_batch_larger_than_one_task(batch_rows):
    """x @ w in tasks of rows (the last one partial), x^T @ g in partial sums of batch ranges
    of at least as many rows each: as many tasks as the batch needs at run time, none queued
    for a batch of one task (the moons step's). x @ w's accumulator is zeroed in parallel_maps'
    row blocks (fewer rows than a product task): its one-task batch is one block's rows.
    Rows of three vector registers (48 floats with AVX-512, 24 with AVX2) are small-rows at
    either width; 48 AVX2 floats, six registers a row, are blocked (tasks of a few row panels)."""
    assert 24 > SHORT_K  # not one pass with an epilogue
    m = 3 * vector_bytes() // 4
    graph = _one_product(batch_rows, 24, m)
    assert _schedule(graph) == "small-rows"
    assert PARALLEL_FN in compiled(graph).stages["llvm"]
    fill_rows = max(PARALLEL_MAP_ROWS, -(-PARALLEL_MAP_MIN // m))
    task_rows = small_task_rows(24 * m, small_block_rows((0, 2, 1), m, 4))  # x @ w: (m, k, n) order, float32
    rows = min(task_rows, fill_rows) if batch_rows else rows_per_task(24 * m)
    two_tasks = rows + 1 if batch_rows else 2 * rows  # the fewest rows that make two
    for batch, queued in ((1, False), (rows, False), (two_tasks - 1, False), (two_tasks, True),
                          (7 * rows + 3, True), (TASKS_MAX * rows * 3 + 1, True)):
        before = teams_forked()
        check(graph, batch, batch)
        assert (teams_forked() > before) == queued, batch


def test_wide_rows_of_a_narrow_product_split_into_short_tasks():
    """x @ w with rows of 600 x 16 multiply-adds (as the large step's 1024 x 10 output layer):
    tasks of 128 rows, so that a batch of 129 rows and more runs on threads (in tasks of 512
    rows, a batch of 512 ran on one thread), matching the reference at every batch. Neither x @ w's
    zero fill nor the input check queues tasks of its own up to 200 rows. 16 columns (one or two
    vector registers) are small-rows at either width; 15 are blocked with AVX2 (8 + 7 lanes)."""
    rows = small_task_rows(600 * 16, small_block_rows((0, 2, 1), 16, 4))
    fill_rows = max(PARALLEL_MAP_ROWS, -(-PARALLEL_MAP_MIN // 16))
    assert rows == 128 < 200 < fill_rows and 200 * 600 < 2 * CHECK_TASK_ELEMENTS
    graph = _one_product(True, 600, 16)
    assert _schedule(graph) == "small-rows"
    assert PARALLEL_FN in compiled(graph).stages["llvm"]
    for batch, queued in ((1, False), (7, False), (13, False), (33, False), (rows, False), (rows + 1, True),
                          (200, True), (257, True), (512, True), (4099, True)):
        before = teams_forked()
        check(graph, batch, batch)
        assert (teams_forked() > before) == queued, batch


def test_weight_gradients_go_to_threads_and_match_at_every_batch():
    kc = cache_blocks(4)[2]
    assert 181 * 197 < PARALLEL_WORK_MIN <= 181 * 197 * kc  # the product at a batch of kc rows carries enough work
    graph = _one_product(False, 181, 197)
    assert PARALLEL_FN in compiled(graph).stages["llvm"]
    step = PACK_ROWS_STEP  # the batch's rows are packed in groups of step, then the rest
    for batch in (1, step - 1, step, 2 * step + 1, kc, kc + 1):
        check(graph, batch, batch)


def test_products_with_the_batch_as_rows_go_to_threads_and_match_at_every_batch():
    mc = cache_blocks(4)[0]
    assert mc * 181 * 197 >= PARALLEL_WORK_MIN > 181 * 197  # one task's rows carry enough work
    graph = _one_product(True, 181, 197)
    assert PARALLEL_FN in compiled(graph).stages["llvm"]
    for batch in (1, 7, mc, mc + 1, 3 * mc + 5):  # one block (inline) up to mc rows, then several
        check(graph, batch, batch)


def test_parallel_results_are_deterministic():
    graph = matmul_zoo(K, M, "float32")
    inputs, params = arguments(graph, 257, np.random.default_rng(7))
    first = compiled(graph).run(inputs, [p.copy() for p in params])
    for _ in range(3):
        again = compiled(graph).run(inputs, [p.copy() for p in params])
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


def test_a_parallel_training_step_matches_the_reference_over_30_steps():
    sizes = [37, 613, 521, 3]  # 613 * 521 and 37 * 613 * batch products: parallel; short batches too
    fast, fast_model, _ = make_step(sizes, "sgd", "cpu", 1, lr=0.01, momentum=0.9)
    slow, slow_model, _ = make_step(sizes, "sgd", "numpy", 1, lr=0.01, momentum=0.9)
    for model in (fast_model, slow_model):  # uniform(-1, 1) weights scaled by 1/sqrt(fan-in): no blow-up
        for p in model.parameters():
            p.data *= 1 / np.sqrt(p.data.shape[0]) if p.data.ndim == 2 else 1
    rng = np.random.default_rng(3)
    X = rng.standard_normal((64, sizes[0])).astype(np.float32)
    Y = np.tanh(X[:, :3])
    assert PARALLEL_FN in fast.lower(X[:2], Y[:2]).stages["llvm"]
    for step in range(30):
        batch = slice(0, (64, 1, 13, 25, 12)[step % 5])
        np.testing.assert_allclose(fast(X[batch], Y[batch]), slow(X[batch], Y[batch]), rtol=1e-3, atol=1e-5)
    for p, q in zip(fast_model.parameters(), slow_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4)


def check_from_disk(k: int, m: int) -> None:
    """Run in a new process: load the parallel step from the disk cache, check it, print its source."""
    graph = matmul_zoo(k, m, "float32")
    source = compile_kernel(graph).source
    check(graph, 37, 0)
    print(source)


def test_a_second_process_loads_and_runs_a_parallel_step_from_disk():
    compile_kernel(matmul_zoo(K, M, "float32"))
    program = f"from tests.backends.test_cpu_parallel import check_from_disk; check_from_disk({K}, {M})"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "disk"


def forked_child_runs_threads(k: int, m: int, busy: bool) -> None:
    """Run in a new process: call a threaded step, fork (with another thread calling a second
    threaded step meanwhile when ``busy``), call the step in the child, whose task runtime
    starts its pool again, and compare with the parent's result; print what the child ran
    and its pool threads."""
    import os
    import threading

    from mlir_nn.backends import task_runtime

    graph = matmul_zoo(k, m, "float32")
    inputs, params = arguments(graph, 50, np.random.default_rng(5))
    want = compiled(graph).run(inputs, [p.copy() for p in params])
    stop = threading.Event()
    other = matmul_zoo(k + 1, m, "float32")
    other_args = arguments(other, 300, np.random.default_rng(6))
    compiled(other).run(*other_args)

    def keep_busy() -> None:
        while not stop.is_set():
            compiled(other).run(*other_args)

    worker = threading.Thread(target=keep_busy)
    if busy:
        worker.start()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        got = compiled(graph).run(inputs, [p.copy() for p in params])
        same = all(np.allclose(g, w, rtol=2e-4, atol=2e-4) for g, w in zip(got, want))
        # the parent's other thread may have held the pool: the child's is its own
        state = f"{compiled(graph).kernel.threaded} {same} {task_runtime.pool_threads_started()}"
        os.write(write, state.encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 100).decode())
    os.waitpid(pid, 0)
    stop.set()
    if busy:
        worker.join()


@pytest.mark.parametrize("busy", [False, True])
def test_a_forked_child_runs_the_threaded_build_on_a_new_pool(busy):
    program = f"from tests.backends.test_cpu_parallel import forked_child_runs_threads as f; f({K}, {M}, {busy})"
    env = dict(os.environ, MLIR_NN_NUM_THREADS="3")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True 2"
