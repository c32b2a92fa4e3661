"""Which schedule each matrix product of a step gets on the CPU, and why (for ``--stats``).

Read from the linalg module before ``cpu_matmul.rewrite_matmuls``, with the same tests
it applies: a short static k is one element-wise pass (``short_products``); a large
product is blocked and packed, swapped when its few columns fill the register blocks
badly, on threads when its work reaches ``PARALLEL_WORK_MIN``; any other is a loop nest,
vector code per outer iteration when its inner two loops are small and static
(``small-rows`` when that outer loop is the batch).
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


def _describe(op: ir.Operation, threads: bool) -> ProductSchedule:
    m, n, k = cm._sizes(op)
    dtype = str(ir.RankedTensorType(op.result.type).element_type)
    sizes = (_size(m), _size(n), _size(k), dtype)
    large = cm._is_large(op)
    if (large or cm._over_batch_rows(op)) and cm._has_short_k(op):
        return ProductSchedule(*sizes, "short-k", False, f"k <= {cm.SHORT_K}: one pass with its epilogue")
    if large:
        parallel = threads and cm._on_threads(op)
        work = f"work {'>=' if parallel else '<'} {cm.PARALLEL_WORK_MIN} multiply-adds per task"
        if cm._swaps(op):
            return ProductSchedule(*sizes, "blocked-swapped", parallel, f"n={n} fills few block columns; {work}")
        return ProductSchedule(*sizes, "blocked", parallel, f"static work >= {cm.TILED_WORK_MIN}; {work}")
    why = "dynamic columns" if _size(n) is None else f"static work < {cm.TILED_WORK_MIN}" if k != 1 else "k = 1"
    plan = cm.loop_plan(op, threads)
    dims = (m, n, k)
    if not plan.tags:
        return ProductSchedule(*sizes, "loops", False, f"{why}; inner loops dynamic or over {cm.SMALL_VECTOR_MAX}")
    inner = [dims[d] for d in plan.order[1:]]
    vector = f"{why}; a vector of {inner[0]} x {inner[1]} per {'mnk'[plan.order[0]]}"
    if plan.tags[0] == cm.SMALL_VECTOR:
        return ProductSchedule(*sizes, "small-vector", False, vector)
    chunks = f", {len(plan.chunks)} chunks of at most {cm.SMALL_CARRY_MAX} elements" if plan.chunks else ""
    return ProductSchedule(*sizes, "small-rows", cm.SMALL_TASKS in plan.tags,
                           f"{vector}, blocks of {cm.SMALL_ROW_BLOCK} rows{chunks}")


def product_schedules(module: ir.Module, threads: bool = True) -> list[ProductSchedule]:
    """The schedule of each ``linalg.matmul`` of ``module`` (not yet rewritten), in order."""
    with module.context:
        return [_describe(op, threads) for op in collect_ops(module, lambda op: op.name == "linalg.matmul")]
