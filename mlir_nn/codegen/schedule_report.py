"""Which schedule each matrix product of a step gets on the CPU, and why (for ``--stats``).

Read from the linalg module before ``cpu_matmul.rewrite_matmuls``: each product's
``cpu_matmul.product_plan``, the same decision the rewrite then acts on, with its sizes and
element type, and whether it accumulates into its parameter (``cpu_matmul.update_of``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from mlir_nn.codegen import cpu_matmul as cm
from mlir_nn.codegen.walk import collect_ops


@dataclass(frozen=True)
class ProductSchedule:
    m: int | None  # None: the batch (dynamic)
    n: int | None
    k: int | None
    dtype: str
    schedule: str  # "short-k", "blocked", "blocked-swapped", "small-vector", "small-rows" or "loops"
    threads: bool
    reason: str

    def __str__(self) -> str:
        sizes = " x ".join("N" if d is None else str(d) for d in (self.m, self.n, self.k))
        where = "threads" if self.threads else "one thread"
        return f"{sizes} {self.dtype}: {self.schedule}, {where} ({self.reason})"


def _size(d: int) -> int | None:
    return None if ir.ShapedType.is_dynamic_size(d) else d


def _describe(op: ir.Operation, threads: bool, batch_rows: int | None) -> ProductSchedule:
    plan = cm.product_plan(op, threads, batch_rows=batch_rows)
    dtype = str(ir.RankedTensorType(op.result.type).element_type)
    reason = plan.reason
    if plan.blocked and cm.update_of(op, plan) is not None:
        depth, why = cm.update_slice_depth(op, plan)
        slices = f", kc slices {depth} deep: {why}" if depth is not None else ""
        reason += f"; accumulated into its parameter (the SGD update), in tasks of one row panel{slices}"
    return ProductSchedule(*map(_size, cm._sizes(op)), dtype, plan.kind, plan.threads, reason)


def product_schedules(module: ir.Module, threads: bool = True, batch_rows: int | None = None
                      ) -> list[ProductSchedule]:
    """The schedule of each ``linalg.matmul`` of ``module`` (not yet rewritten), in order, a
    dynamic batch priced at ``batch_rows`` rows (``Graph.batch_rows``)."""
    with module.context:
        return [_describe(op, threads, batch_rows) for op in collect_ops(module, lambda op: op.name == "linalg.matmul")]
