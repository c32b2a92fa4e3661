"""Measures the product schedules' table of rates on the host (``mlir-nn calibrate``).

Each rate comes from one small float32 product compiled through the cpu backend with a table
that forces the schedule measured (``FORCED``) and timed on this machine: the least of its
calls' wall times (other processes only add to them), less the call overhead (a 2 x 2 x 2
product's time). On one thread:

* ``blocked``: 384 x 384 x 384 blocked; ``swapped``: 384 x 384 x 12 swapped (12 columns fill
  whole register blocks as rows); ``loops``: 32 x 32 x 32 as a loop nest; ``blocked_setup_ns``:
  32 x 32 x 32 blocked, less its work at the blocked rate; ``plain_loops``: 4096 batch rows times 100 x 100
  as a loop nest without vector code, the slower of B (k, n) and B stored (n, k) (a dot product
  per element);
* ``batch_sums``: a 64 x 64 weight gradient over 4096 batch rows as vector code (a loop over
  chunks of its rows);
* ``small_rows``: 4096 batch rows times (k, n) with k * n = 4096 and rows of 1, 4 and 8 vector
  registers, as vector code per block of rows;

``task_ns``: a 48 x 384 x 384 blocked product (a few tasks of 12-row panels) on the pool's
threads, less its one-thread time divided by the threads: the hand-off's fixed cost. Timed on
the 384 x 384 x 384 product, the threads' proportional losses (imbalance, shared caches) made it
13-21 us on a Zen 5 guest (AMD EPYC, family 26), against 3.3 us at 48 rows, 3.4 at 96, 4.3 at
192 and 9.5 at 384 (one-thread times 53 to 441 us, load 2.4). Other processes on the cores
make threads look expensive: calibrate on a quiet machine. The whole takes a few seconds (mostly compiling).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from mlir_nn.backends.cpu import CpuExecutable, compile_kernel
from mlir_nn.backends.thread_pool import num_threads
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.schedule_report import product_schedules
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.cpu_target import vector_bytes
from mlir_nn.support.schedule_rates import DEFAULT, ScheduleRates, use_rates

FAST, SLOW = 1e9, 1e-9  # rates that make a schedule win or lose every choice
_NOT_LOOPS = dict(loops=SLOW, plain_loops=SLOW, batch_sums=SLOW, small_rows=(SLOW,) * 3, task_ns=0.0)
FORCED = {
    "blocked": dataclasses.replace(DEFAULT, swapped=SLOW, **_NOT_LOOPS),
    "blocked-swapped": dataclasses.replace(DEFAULT, swapped=FAST, **_NOT_LOOPS),
    "loops": dataclasses.replace(DEFAULT, blocked=SLOW, swapped=SLOW, small_rows=(FAST,) * 3),
    "small-rows": dataclasses.replace(DEFAULT, loops=SLOW, small_rows=(FAST,) * 3),
}
BATCH_ROWS = 4096
LARGE, SWAPPED_COLUMNS, SMALL = 384, 12, 32
TASK_ROWS = 48  # the rows of the product that the hand-off to threads is timed with
PLAIN = 100  # N x 100 x 100: a loop nest whose inner loops (k * n) are too long for vector code
BATCH_SUM = 64  # a 64 x 64 weight gradient: its sum over the batch in a loop over chunks of rows
ROUNDS = 5  # the threaded product is timed in rounds (the least counts): other processes take cores for a while


def _product(m: int | str, k: int, n: int, transpose_b: bool = False) -> Graph:
    """A @ B, A (m, k) an input (m "N": the batch), B (k, n) a parameter (stored (n, k) when
    ``transpose_b``), float32."""
    a = make_node("input", [], name="a", shape=(m, k), dtype="float32")
    b = make_node("param", [], name="b", shape=(n, k) if transpose_b else (k, n), dtype="float32")
    name = f"calibrate_{m}x{k}x{n}{'_bt' if transpose_b else ''}"
    return Graph((a,), (b,), (make_node("matmul", [a, b], transpose_b=transpose_b),), name=name)


def _batch_sum(m: int, n: int) -> Graph:
    """X^T G summed over the batch, X (N, m), G (N, n) inputs, float32: a weight gradient."""
    x = make_node("input", [], name="x", shape=("N", m), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", n), dtype="float32")
    return Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name=f"calibrate_sum_{m}x{n}")


def _compiled(graph: Graph, schedule: str, threads: bool) -> CpuExecutable:
    """``graph`` compiled with its product forced to ``schedule``; RuntimeError if it is not."""
    with use_rates(FORCED[schedule]):
        got = [s.schedule for s in product_schedules(emit_linalg(graph), threads)]
        if got != [schedule] and not (schedule == "loops" and got in (["small-vector"], ["small-rows"])):
            raise RuntimeError(f"calibration: {graph.name} was planned as {got}, not as {schedule}")
        return CpuExecutable(graph, compile_kernel(graph, threads=threads))


def _seconds(call: Callable[[], object], budget_s: float) -> float:
    """The least wall seconds of ``call`` over about ``budget_s`` (after one warm-up call)."""
    call()
    times: list[float] = []
    end = time.perf_counter() + budget_s
    while len(times) < 5 or (time.perf_counter() < end and len(times) < 1000):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def _timed(graph: Graph, schedule: str, budget_s: float, threads: bool = False) -> float:
    """Nanoseconds per call of ``graph`` with its product as ``schedule``."""
    executable = _compiled(graph, schedule, threads)
    rng = np.random.default_rng(0)

    def array(shape: tuple) -> np.ndarray:
        return rng.standard_normal([BATCH_ROWS if d == "N" else d for d in shape]).astype(np.float32)

    inputs, params = [array(x.shape) for x in graph.inputs], [array(p.shape) for p in graph.params]
    return _seconds(lambda: executable.run(inputs, params), budget_s) * 1e9


def _work(graph: Graph) -> int:
    """Multiply-adds of the one product of ``graph`` (at BATCH_ROWS rows of the batch)."""
    (out,) = graph.outputs
    a = out.inputs[0]
    k = a.shape[0] if out.attr("transpose_a", False) else a.shape[1]
    return int(np.prod([BATCH_ROWS if d == "N" else d for d in (*out.shape, k)]))


def measure(budget_s: float = 0.3, report: Callable[[str], None] = lambda line: None) -> ScheduleRates:
    """The host's table of rates, measured (``budget_s``: timing seconds per probe)."""
    def rate(graph: Graph, schedule: str, threads: bool = False) -> float:
        ns = max(_timed(graph, schedule, budget_s, threads) - overhead, 1.0)
        report(f"{graph.name} {schedule}: {ns / 1e3:.1f} us, {_work(graph) / ns:.2f} multiply-adds/ns")
        return _work(graph) / ns

    overhead = _timed(_product(2, 2, 2), "loops", budget_s)
    report(f"call overhead: {overhead:.0f} ns")
    large = _product(LARGE, LARGE, LARGE)
    blocked = rate(large, "blocked")
    swapped = rate(_product(LARGE, LARGE, SWAPPED_COLUMNS), "blocked-swapped")
    small = _product(SMALL, SMALL, SMALL)
    loops = rate(small, "loops")
    plain_loops = min(rate(_product("N", PLAIN, PLAIN, t), "loops") for t in (False, True))
    batch_sums = rate(_batch_sum(BATCH_SUM, BATCH_SUM), "loops")
    setup = max(_timed(small, "blocked", budget_s) - overhead - _work(small) / blocked, 0.0)
    report(f"blocked setup: {setup:.0f} ns")
    lanes = vector_bytes() // 4
    small_rows = tuple(rate(_product("N", 4096 // (r * lanes), r * lanes), "small-rows") for r in (1, 4, 8))
    threads = num_threads()
    few_tasks = _product(TASK_ROWS, LARGE, LARGE)
    alone = _timed(few_tasks, "blocked", budget_s) - overhead
    together = min(_timed(few_tasks, "blocked", budget_s / ROUNDS, threads=True) for _ in range(ROUNDS)) - overhead
    task = together - alone / threads if threads > 1 else alone  # one thread: the pool never pays
    report(f"task on {threads} threads: {task:.0f} ns")
    return ScheduleRates(blocked, swapped, loops, plain_loops, batch_sums, small_rows, setup,
                         max(task, 0.0), threads, source="measured")
