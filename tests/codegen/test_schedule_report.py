"""The schedule report agrees with what cpu_matmul.rewrite_matmuls then does (codegen/schedule_report.py)."""

from __future__ import annotations

import pytest
from mlir import ir

from mlir_nn.codegen import cpu_matmul, emit_linalg
from mlir_nn.codegen.cpu_matmul import SMALL_CHUNK_TASKS, SMALL_ROWS, SMALL_TASKS, SMALL_VECTOR, rewrite_matmuls
from mlir_nn.codegen.schedule_report import product_schedules
from mlir_nn.codegen.walk import collect_ops
from tests.egraph.util import trace_mlp


def _generic_tags(module, threads: bool) -> list[set[str]]:
    """The schedule tags ``cpu_matmul`` puts on the loop nests it makes of each product (one,
    or one per chunk of a large accumulator), before its transform schedule consumes them, and
    "scf.forall" when it made tasks of its own (a sum over the batch in partial sums)."""
    tags = []
    with module.context:
        for op in collect_ops(module, lambda op: op.name == "linalg.matmul"):
            before = set(collect_ops(module, lambda o: o.name in ("linalg.generic", "scf.forall")))
            with ir.InsertionPoint(op), op.location:
                cpu_matmul._as_generic(op, cpu_matmul.loop_plan(op, threads))
            made = [o for o in collect_ops(module, lambda o: o.name in ("linalg.generic", "scf.forall"))
                    if o not in before]
            kinds = (SMALL_ROWS, SMALL_VECTOR, SMALL_TASKS, SMALL_CHUNK_TASKS)
            tags.append({t for o in made for t in kinds if t in o.attributes}
                        | {o.name for o in made if o.name == "scf.forall"})
    return tags


@pytest.mark.parametrize(
    "widths, batch, dtype",
    [
        ([2, 32, 32, 16, 1], 1000, "float32"),  # the moons step: short k and small rows
        ([784, 256, 10], 1024, "float32"),  # blocked on threads, small rows on threads
        ([64, 64, 32, 10], 256, "float64"),
        ([13, 257, 7], 33, "float32"),
        ([1000, 10], 512, "float32"),  # narrow over the batch: small rows, the gradient in tasks of chunks
    ],
)
@pytest.mark.parametrize("threads", [True, False])
def test_the_report_names_the_schedules_the_rewrite_gives(widths, batch, dtype, threads):
    graph, _, _ = trace_mlp(widths, batch, dtype=dtype)
    module = emit_linalg(graph, wide_sums=True)
    report = product_schedules(module, threads)
    kinds = [s.schedule for s in report]
    for schedule, tags in zip(report, _generic_tags(module, threads)):
        if schedule.schedule in ("small-rows", "small-vector", "loops"):  # a loop nest: its tags say which
            want = {"small-rows": {SMALL_ROWS}, "small-vector": {SMALL_VECTOR}, "loops": set()}[schedule.schedule]
            # tasks of rows, of a sum's chunks, or of partial sums over batch ranges
            on_threads = tags & {SMALL_TASKS, SMALL_CHUNK_TASKS, "scf.forall"}
            assert tags - on_threads == want and len(on_threads) == schedule.threads, schedule
    blocked, _ = rewrite_matmuls(module, threads)
    assert sum(k.startswith("blocked") for k in kinds) == blocked
    assert all(s.reason for s in report)


def test_a_wide_first_layer_is_blocked_on_threads():
    graph, _, _ = trace_mlp([784, 256, 10], 1024, dtype="float32")
    report = product_schedules(emit_linalg(graph, wide_sums=True))
    first = [s for s in report if (s.n, s.k) == (256, 784)]
    assert first and first[0].schedule == "blocked" and first[0].threads and first[0].m is None
    assert not any(s.threads for s in product_schedules(emit_linalg(graph, wide_sums=True), threads=False))


def test_the_plan_carries_the_loop_nest_only_for_products_that_are_not_blocked():
    graph, _, _ = trace_mlp([784, 256, 10], 33, dtype="float32")
    module = emit_linalg(graph, wide_sums=True)
    with module.context:
        plans = [cpu_matmul.product_plan(op, True) for op in collect_ops(module, lambda op: op.name == "linalg.matmul")]
    assert {p.kind for p in plans} >= {"blocked", "small-rows"}
    for plan in plans:
        assert (plan.loops is None) == (plan.blocked or plan.kind == "short-k"), plan
