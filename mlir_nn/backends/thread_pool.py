"""Size of the thread pool that runs the tasks of compiled steps (MLIR's async runtime).

``MLIR_NN_NUM_THREADS`` sets the pool's thread count; the default is the number of cores
this process may run on (``os.sched_getaffinity``). The calling thread dispatches the
tasks, runs one of them and then waits for the rest, so it adds little work of its own:
a pool one thread smaller than the core count left a core idle most of the step (measured:
1.9x slower on 2 cores), so the pool gets the full count.

The runtime creates its pool (LLVM's default thread pool) on first use and sizes it from
the CPU affinity of the thread that uses it first; ``size_pool`` makes that first use
with the calling thread's affinity narrowed to the wanted count, then restores it.
"""

from __future__ import annotations

import ctypes
import os

ENV = "MLIR_NN_NUM_THREADS"


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def num_threads() -> int:
    """Threads of the pool: ``MLIR_NN_NUM_THREADS`` or the cores this process may use."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return available_cores()
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: expected a positive integer") from None
    if value < 1:
        raise ValueError(f"{ENV}={text!r}: expected a positive integer")
    return value


def pool_size() -> int:
    """Worker threads of the pool."""
    return num_threads()


def size_pool(runtime: ctypes.CDLL) -> int:
    """Create the async runtime's pool with ``pool_size()`` threads (unless it exists); its size."""
    count = runtime.mlirAsyncRuntimGetNumWorkerThreads
    count.restype = ctypes.c_int64
    if not hasattr(os, "sched_setaffinity"):
        return int(count())
    mask = os.sched_getaffinity(0)
    wanted = pool_size()
    narrowed = set(sorted(mask)[:wanted]) if wanted <= len(mask) else mask
    # more threads than cores: LLVM caps its pool at the affinity count, so it cannot exceed it
    os.sched_setaffinity(0, narrowed)
    try:
        return int(count())
    finally:
        os.sched_setaffinity(0, mask)
