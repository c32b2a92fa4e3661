"""The table of rates that the CPU product schedules are priced by (``schedule_costs``), one per machine.

Rates are multiply-adds per nanosecond on one thread, packing and epilogues included, for
float32 and float64 alike (a choice compares schedules of one element type, whose rates scale
together). ``DEFAULT`` holds the rates measured on this project's machine type (an AMD EPYC,
znver4, AVX-512, two cores): its fixed costs are set so that the break-evens are the thresholds
measured there before the cost model (``TILED_WORK_MIN``, ``PARALLEL_WORK_MIN``, ``SWAP_GAIN``),
so plans are unchanged where no table was measured. ``mlir-nn calibrate`` measures a table on
the host (``mlir_nn.backends.schedule_calibration``); with ``--store`` it is kept in the cache
folder under the CPU's identity (``cpu_target.cpu_identity``) and ``active`` returns it from then
on. Its ``digest`` is part of every compiled step's cache key: plans depend on it.

Calibration runs on request only.

A compile in a separate process (the tiered first call's) loads the machine's table, not a
``use_rates`` override of the calling process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlir_nn.support.cpu_target import cpu_identity
from mlir_nn.support.disk_cache import TMP_PREFIX, cache_dir

FOLDER = "schedule-rates"
FORMAT = 4
# Thresholds measured on the machine type before the cost model; the default table's break-evens.
TILED_WORK_MIN = 1 << 12  # static m * n * k (dynamic dims as 1) from which packing pays
PARALLEL_WORK_MIN = 1 << 18  # multiply-adds of one task from which a blocked product's tasks go on threads
SWAP_GAIN = 1.2  # a product runs swapped when that fills this many times the share of register blocks


@dataclass(frozen=True)
class ScheduleRates:
    """Rates of the product schedules on one machine (multiply-adds per ns, one thread) and
    fixed costs (ns). ``small_rows``: vector code per block of batch rows whose rows fill
    (1 to 2, 2 to 4, more than 4) vector registers. ``source``: where the table comes from
    (not part of its digest)."""

    blocked: float  # packed register blocks, all their lanes used
    swapped: float  # the same as C^T = op(B)^T op(A)^T, transposed back
    loops: float  # a small product's loop nest as vector code (``mlirnn.small_vector``, ``small_rows``)
    plain_loops: float  # a loop nest without vector code (inner loops dynamic or too long)
    batch_sums: float  # vector code summing over the batch (a weight gradient), one thread, in chunks or not
    small_rows: tuple[float, float, float]
    blocked_setup_ns: float  # a blocked product's fixed cost (packing buffers, its loop nests)
    task_ns: float  # handing a product's tasks to the thread pool and waiting for the last
    threads: int  # threads of the pool the rates were measured with
    source: str = "default"

    def digest(self) -> str:
        """sha256 of the rates (what plans depend on)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "source"}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps(dict(dataclasses.asdict(self), format=FORMAT), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ScheduleRates:
        """The table written by ``to_json``; ValueError when it is not one."""
        try:
            fields = json.loads(text)
            if fields.pop("format") != FORMAT:
                raise ValueError("another format")
            fields["small_rows"] = tuple(float(r) for r in fields["small_rows"])
            rates = cls(**fields)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a schedule rates table: {error}") from None
        numbers = [rates.blocked, rates.swapped, rates.loops, rates.plain_loops, rates.batch_sums,
                   *rates.small_rows]
        if not all(r > 0 for r in numbers) or rates.blocked_setup_ns < 0 or rates.task_ns < 0 or rates.threads < 1:
            raise ValueError(f"schedule rates must be positive: {rates}")
        return rates


# blocked: 68-86 GFLOP/s (a 100-wide layer's products, one core). The static loop rate was not
# measured on its own: with it, the blocked setup is what makes TILED_WORK_MIN the break-even.
_BLOCKED, _LOOPS = 40.0, 8.0
DEFAULT = ScheduleRates(
    blocked=_BLOCKED,
    swapped=_BLOCKED / SWAP_GAIN,
    loops=_LOOPS,
    plain_loops=_LOOPS,  # the threshold did not tell the loop nests apart
    # one core, 3000 rows, the forward, input and weight gradient products of MLP layers 2-1024
    # wide: sums over the batch in rows of at most 4 registers 38-53 (32 x 32, 80 x 40, 64 x 64);
    batch_sums=45.0,
    # vector rows of 1-2 registers 41-45 (32-16, 48-24, 64-16), 2-4 registers 43-51 (32-32,
    # 80-40, 64-64, 784-32), more 13 (40-80: spilled)
    small_rows=(42.0, 48.0, 13.0),
    blocked_setup_ns=TILED_WORK_MIN * (1 / _LOOPS - 1 / _BLOCKED),
    task_ns=PARALLEL_WORK_MIN / _BLOCKED / 2,  # two threads pay from that work on
    threads=2,
)


def table_path() -> Path:
    """Where the host's table is stored: the cache folder, under the CPU's identity."""
    return cache_dir() / FOLDER / f"{cpu_identity()}.json"


def store(rates: ScheduleRates) -> Path:
    """Write ``rates`` as the host's table (atomically); its path."""
    path = table_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(rates.to_json())
    os.replace(staging, path)
    _loaded.clear()
    return path


def stored() -> ScheduleRates | None:
    """The host's measured table, None when there is none or it does not read as one."""
    key = str(table_path())
    if key not in _loaded:
        try:
            _loaded[key] = ScheduleRates.from_json(Path(key).read_text())
        except (OSError, ValueError):
            _loaded[key] = None
    return _loaded[key]


_loaded: dict[str, ScheduleRates | None] = {}  # by path: read once per process
_override: list[ScheduleRates] = []


def active() -> ScheduleRates:
    """The table plans are made with: a ``use_rates`` override, the host's measured table, or DEFAULT."""
    if _override:
        return _override[-1]
    return stored() or DEFAULT


@contextmanager
def use_rates(rates: ScheduleRates) -> Iterator[ScheduleRates]:
    """Plan with ``rates`` inside the block (tests, calibration)."""
    _override.append(rates)
    try:
        yield rates
    finally:
        _override.pop()
