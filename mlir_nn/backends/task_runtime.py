"""The task runtime of compiled steps (``task_runtime.c``): MLIR's async runtime C API on a
pool where the waiting thread works too.

The parallel loops of a step are lowered by MLIR's async passes to calls of the
``mlirAsyncRuntime*`` functions; the JIT and the cached shared objects find them among
the process's global symbols, so the runtime is loaded (``RTLD_GLOBAL``) before any step.
It is built once per machine and cache (``c_build``) and needs only the C library and
pthreads. ``MLIR_NN_NUM_THREADS`` (``thread_pool``) sets the computing threads: the pool
gets one fewer, since the caller of a step runs tasks while it waits for them.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

from mlir_nn.backends.c_build import CBuild
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.thread_pool import num_threads

API_PREFIX = "mlirAsyncRuntim"  # of the functions it defines for MLIR (one is spelled "Runtim")
BUILD = CBuild(Path(__file__).with_name("task_runtime.c"), "task-runtime", "libmlirnn_tasks.so", "task runtime",
               lambda: ["-pthread"], lambda: [])

def prepare() -> None:
    """Start building the runtime in the background unless it is loaded or the cache holds it."""
    if not load.cache_info().currsize:
        BUILD.prepare()


@cache
def load() -> ctypes.CDLL:
    """The runtime, built if needed and loaded once with global symbols, its threads set from
    ``MLIR_NN_NUM_THREADS``."""
    path = BUILD.path()
    try:
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise NativeError(f"loading the task runtime {path} failed: {error}") from None
    library.mlirnn_runtime_set_threads.argtypes = [ctypes.c_int]
    library.mlirnn_runtime_live_objects.restype = ctypes.c_longlong
    library.mlirnn_runtime_tasks_started.restype = ctypes.c_longlong
    library.mlirAsyncRuntimGetNumWorkerThreads.restype = ctypes.c_int64
    library.mlirnn_runtime_set_threads(num_threads())
    return library


def computing_threads() -> int:
    """Threads that run a step's tasks: the pool's and the caller."""
    return int(load().mlirAsyncRuntimGetNumWorkerThreads())


def pool_threads_started() -> int:
    """Pool threads started in this process (they start with the first task)."""
    return int(load().mlirnn_runtime_started_threads())


def live_objects() -> int:
    """Tokens, values and groups not yet freed: 0 whenever no step is running."""
    return int(load().mlirnn_runtime_live_objects())


def tasks_started() -> int:
    """Tasks queued in this process so far (a parallel loop of one block queues none)."""
    return int(load().mlirnn_runtime_tasks_started())
