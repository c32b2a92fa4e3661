"""Estimated times of a CPU product's candidate schedules, and the choices ``cpu_matmul`` makes by them.

Each estimate is multiply-adds at that schedule's rate (``schedule_rates``), divided by the
share of its register blocks' lanes the product fills, plus its fixed costs; threads divide a
blocked product's time by their count and add the pool's task cost. Which schedules are legal
for a product stays with ``cpu_matmul``'s predicates; these functions only price them. Each
choice returns the estimates compared, cheapest first, for the plan's reason
("blocked 12.3 us < loops 15.1 us"). Ties (within rounding) go to the first candidate named.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir_nn.support.schedule_rates import ScheduleRates

TIE = 1e-9  # relative difference of two estimates within which they are equal


@dataclass(frozen=True)
class Estimate:
    name: str
    ns: float

    def __str__(self) -> str:
        return f"{self.name} {_duration(self.ns)}"


def _duration(ns: float) -> str:
    for unit, scale in (("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def ranked(*candidates: Estimate) -> tuple[Estimate, ...]:
    """``candidates`` cheapest first; an estimate within TIE of an earlier-named one ranks after it."""
    order = {id(e): i for i, e in enumerate(candidates)}
    return tuple(sorted(candidates, key=lambda e: e.ns * (1 + TIE * order[id(e)])))


def compared(estimates: tuple[Estimate, ...]) -> str:
    """'a 1 us < b 2 us, c 3 us': the chosen one against the others."""
    return f"{estimates[0]} < {', '.join(map(str, estimates[1:]))}"


LOOP_NESTS = ("vector", "plain")  # the kinds of static loop nest ``loop_rate`` prices
# A dynamic batch is priced per row, the fixed costs spread over the rows the step was traced
# with (``Graph.batch_rows``), else over this many: at the shapes measured (one core, 100-16384
# rows), blocked / loops time was the same at every batch.
BATCH_ROWS_ESTIMATE = 256
WIDE_ROW_REGISTERS = 4  # vector rows wider than this many registers spill their accumulators


def loop_rate(nest: str, rates: ScheduleRates) -> float:
    """The rate of a loop nest of static sizes of the kind ``nest`` (one of LOOP_NESTS)."""
    return {"vector": rates.loops, "plain": rates.plain_loops}[nest]


def blocked_or_loops(work: int, nest: str, rates: ScheduleRates) -> tuple[Estimate, ...]:
    """A product of static sizes, ``work`` multiply-adds, blocked (fixed setup, the blocked rate) or
    as a loop nest of the kind ``nest``."""
    return ranked(Estimate("blocked", rates.blocked_setup_ns + work / rates.blocked),
                  Estimate("loops", work / loop_rate(nest, rates)))


def vector_rows_rate(registers: float, ragged: bool, rates: ScheduleRates) -> float:
    """The rate of vector code per block of batch rows whose result rows fill ``registers``; rows
    that are ``ragged`` (a part no power of two of lanes, widened and shuffled) at the rate of wide
    ones (one core, 3000 rows, k = 200: 50 floats 29 multiply-adds/ns, 36 floats 38)."""
    narrow, mid, wide = rates.small_rows
    if ragged or registers > WIDE_ROW_REGISTERS:
        return wide
    return narrow if registers < 2 else mid


def batch_sums_rate(registers: float, ragged: bool, rates: ScheduleRates) -> float:
    """The rate of vector code summing over the batch whose carried rows fill ``registers``: wider
    or ``ragged`` ones spill or shuffle as vector rows do (a 40 x 80 weight gradient in chunks of
    2 x 80: 10 multiply-adds/ns, one core; 80 x 40 and 64 x 64: 40-53)."""
    return rates.small_rows[2] if ragged or registers > WIDE_ROW_REGISTERS else rates.batch_sums


def per_batch_row(row_work: int, blocked_rate: float, rate: float, rates: ScheduleRates,
                  loops_setup_ns: float = 0.0, batch_rows: int = BATCH_ROWS_ESTIMATE) -> tuple[Estimate, ...]:
    """One row of a product over a dynamic batch (``row_work`` multiply-adds a row) blocked at
    ``blocked_rate`` (the blocked or swapped rate times the share of lanes it fills) against a loop
    nest at ``rate``, each one's fixed cost per call (the blocked setup, ``loops_setup_ns``) spread
    over ``batch_rows`` rows (the step's estimate, ``Graph.batch_rows``)."""
    blocked = rates.blocked_setup_ns / batch_rows + row_work / blocked_rate
    loops = loops_setup_ns / batch_rows + row_work / rate
    return ranked(Estimate("blocked", blocked), Estimate("loops", loops))


def on_threads(task_work: int, rates: ScheduleRates) -> tuple[Estimate, ...]:
    """One task of a blocked product (``task_work`` multiply-adds) on the pool's threads or on one."""
    alone = task_work / rates.blocked
    return ranked(Estimate(f"{rates.threads} threads", alone / rates.threads + rates.task_ns),
                  Estimate("one thread", alone))


def swapped_or_not(work: int, fill: float, swapped_fill: float, rates: ScheduleRates) -> tuple[Estimate, ...]:
    """A blocked product whose register blocks' lanes it fills by the share ``fill``, against the
    same swapped (C^T), which fills ``swapped_fill``."""
    return ranked(Estimate("blocked", work / (rates.blocked * fill)),
                  Estimate("blocked-swapped", work / (rates.swapped * swapped_fill)))
