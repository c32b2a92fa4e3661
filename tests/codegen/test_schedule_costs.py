"""Product schedules chosen by estimated cost from a table of rates (codegen/schedule_costs.py)."""

from __future__ import annotations

import dataclasses

import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.cpu_matmul import product_plan
from mlir_nn.codegen.schedule_costs import Estimate, blocked_or_loops, on_threads, ranked, swapped_or_not
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.cpu_target import register_block, vector_bytes
from mlir_nn.support.schedule_rates import (
    DEFAULT,
    PARALLEL_WORK_MIN,
    SWAP_GAIN,
    TILED_WORK_MIN,
    ScheduleRates,
    use_rates,
)
from tests.codegen.test_cpu_matmul import BATCHES, _assert_matches_reference
from tests.codegen.zoo import matmul_zoo

pytestmark = pytest.mark.usefixtures("planned_for_the_schedule_tests")  # (tests/conftest.py)

HUGE, TINY = 1e9, 1e-9
# tables that make one side of every choice win: blocked (unswapped) on threads, or loops on one thread
ALL_BLOCKED = dataclasses.replace(DEFAULT, loops=TINY, plain_loops=TINY, batch_sums=TINY,
                                  swapped=TINY, small_rows=(TINY,) * 3, blocked_setup_ns=0.0, task_ns=0.0)
ALL_LOOPS = dataclasses.replace(DEFAULT, blocked=TINY, swapped=TINY, small_rows=(HUGE,) * 3, task_ns=HUGE)
ALL_SWAPPED = dataclasses.replace(DEFAULT, swapped=HUGE, task_ns=HUGE)


def _plans(graph: Graph, rates: ScheduleRates | None = None, threads: bool = True):
    module = emit_linalg(graph)
    with module.context:
        return [product_plan(op, threads, rates, graph.batch_rows)
                for op in collect_ops(module, lambda o: o.name == "linalg.matmul")]


def _product(m: int | str, k: int, n: int, dtype: str = "float32") -> Graph:
    """A @ B with A (m, k) an input (m "N": the batch) and B (k, n) a parameter."""
    a = make_node("input", [], name="a", shape=(m, k), dtype=dtype)
    b = make_node("param", [], name="b", shape=(k, n), dtype=dtype)
    return Graph((a,), (b,), (make_node("matmul", [a, b]),), name="product")


def test_the_default_table_breaks_even_at_the_thresholds_measured_before():
    """The default table's break-evens are the fixed thresholds it replaces, ties to the first named."""
    works = (TILED_WORK_MIN - 1, TILED_WORK_MIN)
    assert [blocked_or_loops(w, "vector", DEFAULT)[0].name for w in works] == ["loops", "blocked"]
    names = [on_threads(w, DEFAULT)[0].name for w in (PARALLEL_WORK_MIN - 1, PARALLEL_WORK_MIN)]
    assert names == ["one thread", "2 threads"]
    assert swapped_or_not(1000, 0.5, 0.5 * SWAP_GAIN * 1.01, DEFAULT)[0].name == "blocked-swapped"
    assert swapped_or_not(1000, 0.5, 0.5 * SWAP_GAIN * 0.99, DEFAULT)[0].name == "blocked"
    assert [e.name for e in ranked(Estimate("a", 2.0), Estimate("b", 1.0), Estimate("c", 1.0))] == ["b", "c", "a"]


@pytest.mark.parametrize("m, k, n, kind, threads", [
    (512, 512, 512, "blocked", True),  # large: blocked on threads
    (64, 48, 40, "blocked", False),  # packing pays, threads do not
    (8, 8, 8, "small-vector", False),  # too small to pack
    ("N", 1000, 10, "small-rows", True),  # narrow over the batch
    ("N", 12, 300, "short-k", True),  # one pass, in blocks of rows on threads (it said one thread)
])
def test_the_default_table_picks_the_clear_cut_schedules(m, k, n, kind, threads):
    (plan,) = _plans(_product(m, k, n))
    assert (plan.kind, plan.threads) == (kind, threads), plan


def test_reasons_name_the_estimates_compared():
    (plan,) = _plans(_product(512, 512, 512))
    assert "blocked" in plan.reason and "< loops" in plan.reason and "2 threads" in plan.reason, plan.reason
    assert " ms" in plan.reason and "< one thread" in plan.reason
    (batch,) = _plans(_product("N", 300, 300))
    assert batch.reason.startswith("per batch row: blocked") and "< loops" in batch.reason, batch.reason


def test_expensive_threads_keep_a_large_product_on_one_thread():
    graph = _product(512, 512, 512)
    assert _plans(graph)[0].threads
    (plan,) = _plans(graph, dataclasses.replace(DEFAULT, task_ns=HUGE))
    assert plan.kind == "blocked" and not plan.threads and "one thread" in plan.reason.split("<")[-2]


def test_cheap_threads_put_a_small_blocked_product_on_threads():
    graph = _product(64, 48, 40)
    (plan,) = _plans(graph, dataclasses.replace(DEFAULT, task_ns=0.0))
    assert plan.kind == "blocked" and plan.threads
    assert not _plans(graph, dataclasses.replace(DEFAULT, task_ns=0.0), threads=False)[0].threads


# the table measured on a Zen 5 core (AMD EPYC, family 26), under load: fast register blocks, dear threads
ZEN5_MEASURED = ScheduleRates(blocked=131.0, swapped=66.0, loops=64.0, plain_loops=38.0, batch_sums=90.0,
                              small_rows=(65.0, 111.0, 46.0), blocked_setup_ns=40.0, task_ns=13000.0, threads=2)


@pytest.mark.parametrize("batch, threads", [(16384, True), (64, False)])
def test_threads_of_a_product_over_the_batch_are_priced_at_the_whole_batch(batch, threads):
    """Fast register blocks make one task of mc rows too short for the pool, but a batch of
    16384 rows is many: its product goes on threads; 64 rows stay on one."""
    (plan,) = _plans(_product("N", 64, 64).with_batch_rows(batch), ZEN5_MEASURED)
    assert (plan.kind, plan.threads) == ("blocked", threads), plan.reason
    assert f"at {batch}x64x64:" in plan.reason, plan.reason


def test_products_over_a_large_batch_on_threads_by_the_measured_table_match_the_reference():
    """The forward product and the weight gradient of a 64-wide layer, planned blocked on threads
    by the Zen 5 table at a traced batch of 16384, against the reference at awkward batches."""
    for graph in (_product("N", 64, 64), _weight_gradient(64, 64)):
        graph = graph.with_batch_rows(16384)
        assert [(p.kind, p.threads) for p in _plans(graph, ZEN5_MEASURED)] == [("blocked", True)]
        with use_rates(ZEN5_MEASURED):
            executable = CpuBackend().compile(graph)
        _assert_matches_reference(graph, executable, (*BATCHES, 4099))


def test_the_loop_and_blocked_rates_move_the_packing_choice():
    assert _plans(_product(64, 48, 40), dataclasses.replace(DEFAULT, loops=HUGE))[0].kind != "blocked"
    # 64 x 100 x 100: its loop nest has no vector code (k * n over SMALL_VECTOR_MAX): the plain rate prices it
    assert _plans(_product(64, 100, 100), dataclasses.replace(DEFAULT, loops=HUGE))[0].kind == "blocked"
    assert _plans(_product(64, 100, 100), dataclasses.replace(DEFAULT, plain_loops=HUGE))[0].kind == "loops"
    assert _plans(_product(13, 17, 7))[0].kind != "blocked"
    assert _plans(_product(13, 17, 7), ALL_BLOCKED)[0].kind == "blocked"


def test_the_swapped_rate_moves_the_swap_choice():
    """(N, 516) x (516, 10): few columns, swapped by default; not with a slow swapped rate."""
    assert 10 < register_block(4)[1]
    graph = _product("N", 516, 10)
    assert _plans(graph)[0].kind == "blocked-swapped"
    assert _plans(graph, dataclasses.replace(DEFAULT, swapped=TINY))[0].kind == "blocked"


def test_the_small_rows_rates_move_the_vector_rows_choice():
    """(N, 64) x (64, 64) float32: a row of the result fills 256 bytes, 1 to 8 vector registers."""
    graph = _product("N", 64, 64)
    default = "small-rows" if 2 * vector_bytes() <= 256 <= 4 * vector_bytes() else "blocked"
    assert _plans(graph)[0].kind == default
    assert _plans(graph, dataclasses.replace(DEFAULT, small_rows=(HUGE,) * 3))[0].kind == "small-rows"
    assert _plans(graph, dataclasses.replace(DEFAULT, small_rows=(TINY,) * 3))[0].kind == "blocked"


TABLES = pytest.mark.parametrize("rates", [ALL_BLOCKED, ALL_LOOPS, ALL_SWAPPED], ids=["blocked", "loops", "swapped"])
ZOOS = [(517, 13, "float32"), (257, 33, "float64")]


@TABLES
def test_each_table_changes_some_plans_of_the_zoos(rates):
    def kinds(zoo: Graph, rates: ScheduleRates | None = None) -> list[tuple[str, bool]]:
        return [(p.kind, p.threads) for p in _plans(zoo, rates)]

    zoos = [matmul_zoo(*sizes) for sizes in ZOOS]
    assert any(kinds(zoo) != kinds(zoo, rates) for zoo in zoos)


@TABLES
@pytest.mark.parametrize("k, m, dtype", ZOOS)
def test_every_schedule_the_tables_choose_matches_the_reference(rates, k, m, dtype):
    """The zoo of products and fused ops at awkward sizes, compiled with tables that choose the
    other side of every choice the default makes, against the reference at batches 1 to 257."""
    zoo = matmul_zoo(k, m, dtype)
    with use_rates(rates):
        executable = CpuBackend().compile(zoo)
    _assert_matches_reference(zoo, executable, BATCHES, dtype)


def _weight_gradient(m: int, n: int) -> Graph:
    x = make_node("input", [], name="x", shape=("N", m), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", n), dtype="float32")
    return Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weight_gradient")


def test_sums_over_the_batch_are_priced_by_the_registers_their_rows_fill():
    """A weight gradient's loop nest carries its sum through the batch, per batch row: 64 x 64 in
    chunks whose rows fill 4 registers at the batch-sum rate (as vector code by default: 1.07x
    faster than blocked, measured), 40 x 80 in chunks of 2 x 80 (5 registers, spilled) at the wide
    vector rows' rate (blocked: 5x faster, one core, 3000 rows)."""
    sixty_four, forty = _weight_gradient(64, 64), _weight_gradient(40, 80)
    if vector_bytes() != 64:
        pytest.skip("the register counts are those of 64-byte vectors")
    assert _plans(sixty_four)[0].kind == "small-rows" and _plans(forty)[0].kind == "blocked"
    slow_sums = dataclasses.replace(DEFAULT, batch_sums=TINY)
    assert _plans(sixty_four, slow_sums)[0].kind == "blocked"
    fast_wide = dataclasses.replace(DEFAULT, small_rows=(*DEFAULT.small_rows[:2], HUGE))
    assert _plans(forty, fast_wide)[0].kind == "small-rows"


@pytest.mark.parametrize("k, n, kind", [
    (40, 80, "blocked"),  # rows of 5 registers spill as vector code: blocked 3.2x faster (one core, 3000 rows)
    (80, 40, "small-rows"),  # 2.5 registers: vector rows 1.3x faster
    (32, 16, "small-rows"),  # 1 register: vector rows 2.4x faster than blocked, which fills half its columns
    (200, 50, "blocked"),  # 50 = 32 + 18 lanes, ragged: blocked 1.2x faster
    (300, 10, "blocked-swapped"),  # 10 of 16 lanes, ragged: swapped 2.7x faster than vector rows
    (64, 1, "loops"),  # a dot product per row: 2.2x faster than swapped
])
def test_a_product_over_the_batch_is_priced_per_batch_row(k, n, kind):
    """Priced per batch row, the blocked setup spread over BATCH_ROWS_ESTIMATE rows (not the batch
    counted as one row: 3200 multiply-adds a row were under the whole product's break-even), with
    the loop nest's rate by the registers its rows fill and blocked at its better orientation.
    Measured: one core, 3000 rows, forced schedules."""
    if vector_bytes() != 64:
        pytest.skip("the register counts are those of 64-byte vectors")
    (plan,) = _plans(_product("N", k, n))
    assert plan.kind == kind and plan.reason.startswith("per batch row"), plan


def test_a_weight_gradient_computed_transposed_pays_for_the_copy_back():
    """x^T g of a 64-wide input and 1024-wide output (C 64 x 1024) runs as loops only as C^T,
    transposed back per call: priced in (TRANSPOSE_NS per element over BATCH_ROWS_ESTIMATE rows),
    it stays blocked (as loops the 64-1024-7 Adam step at batch 256 was 24% slower)."""
    if vector_bytes() != 64:
        pytest.skip("the register counts are those of 64-byte vectors")
    (plan,) = _plans(_weight_gradient(64, 1024))
    assert plan.kind == "blocked", plan
    assert _plans(_weight_gradient(64, 1024), dataclasses.replace(DEFAULT, batch_sums=2 * DEFAULT.batch_sums))[0].loops


def test_the_copy_back_is_spread_over_the_rows_the_step_was_traced_with():
    """The same 64 x 1024 weight gradient in a step traced at 4096 rows (``Graph.batch_rows``):
    the copy back spread over them, loops win (the 64-1024-7 Adam step at batch 4096 ran 5.5%
    faster so, two cores, interleaved); traced at 256 rows, or not estimated, it stays blocked."""
    if vector_bytes() != 64:
        pytest.skip("the register counts are those of 64-byte vectors")
    graph = _weight_gradient(64, 1024)
    assert graph.batch_rows is None and _plans(graph)[0].kind == "blocked"
    assert _plans(graph.with_batch_rows(300))[0].kind == "blocked"  # 256 rows
    (plan,) = _plans(graph.with_batch_rows(5000))  # 4096 rows
    assert plan.kind == "small-rows" and plan.reason.startswith("per batch row"), plan
