"""The one-way time of a cache line between the first two cores this process may use.

On a 2-core virtual machine the host may put both cores on one core complex (a shared L3,
about 30 ns) or on two (about 170 ns) and moves them over seconds; a threaded step then runs
at one of two speeds (the large MLP step: 26.5 or 33 ms). ``grid.py`` records it before and
after every point so that each figure says which placement it was taken on.

    python benchmarks/core_latency.py
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

from mlir_nn.backends.c_build import CBuild

BUILD = CBuild(Path(__file__).with_name("core_latency.c"), "core-latency", "libcore_latency.so", "core latency probe",
               lambda: ["-pthread"], lambda: [])
FAR_NS = 80.0  # above this the two cores share no L3 (one complex: 25-35 ns; two: 150-330 ns)


@cache
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(BUILD.path()))
    library.mlirnn_one_way_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    library.mlirnn_one_way_ns.restype = ctypes.c_double
    return library


def one_way_ns(rounds: int = 2_000, repeats: int = 7) -> float | None:
    """The least of ``repeats`` measurements of ``rounds`` round trips (a thread of another
    process that takes either core stalls a measurement: the least is the placement's); None
    with fewer than two cores."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    times = [_library().mlirnn_one_way_ns(cpus[0], cpus[1], rounds) for _ in range(repeats)]
    if min(times) < 0:
        raise RuntimeError(f"core latency probe: could not run a thread on cpu {cpus[1]} beside cpu {cpus[0]}")
    return min(times)


if __name__ == "__main__":
    ns = one_way_ns()
    print("one core" if ns is None else f"{ns:.1f} ns one way ({'no shared L3' if ns > FAR_NS else 'shared L3'})")
