"""The thread runtime of compiled steps (``task_runtime.c``): the part of libomp's ABI
(``__kmpc_*``) that MLIR's OpenMP lowering of parallel loops calls, on a pool where the
calling thread works too.

It defines them as ``__wrap___kmpc_*`` (``WRAPPED``), so that no libomp in the process binds to
this partial runtime, nor the steps to a libomp: the steps' shared objects are linked with
the linker's ``--wrap`` for each call (``link_flags``) and find the wrapped names among the
process's global symbols, so the runtime is loaded (``RTLD_GLOBAL``) before any step; the JIT
is told their addresses (``register``). It is built once per
machine and cache (``c_build``) and needs only the C library and pthreads (not libomp).
``MLIR_NN_NUM_THREADS`` (``thread_pool``) sets the computing threads: the pool gets one
fewer, since the caller of a step is the first thread of each team.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import numpy as np

from mlir_nn.backends.c_build import CBuild
from mlir_nn.backends.thread_pool import num_threads, width_measured
from mlir_nn.backends.workspace import CHOICE_BYTES, CHOICE_OFFSET

# the functions that the LLVM translation of OpenMP's parallel loops calls (none is declared
# in the LLVM dialect: a compile registers them as placeholders)
CALLS = ("__kmpc_fork_call", "__kmpc_for_static_init_8u", "__kmpc_for_static_fini", "__kmpc_dispatch_init_8u",
         "__kmpc_dispatch_next_8u", "__kmpc_barrier", "__kmpc_global_thread_num")
WRAPPED = "__wrap_"  # the runtime's name of a call: this prefix and the call's name
THREAD_PASS = "convert-scf-to-openmp"  # the pass that makes parallel loops forks of the runtime's teams
THREAD_LOWERING = "convert-openmp-to-llvm"  # the pass that lowers what THREAD_PASS made
REGION = "omp.parallel"  # in LLVM-dialect text: code that forks teams on the runtime
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
    library = BUILD.load_global()
    library.mlirnn_runtime_set_threads.argtypes = [ctypes.c_int]
    library.mlirnn_runtime_teams_forked.restype = ctypes.c_longlong
    library.mlirnn_runtime_choice_report.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_longlong)]
    library.mlirnn_runtime_set_threads(num_threads())
    return library


def link_flags() -> list[str]:
    """The linker flags that bind a shared object's calls of the runtime to its wrapped names."""
    return [f"-Wl,--wrap={call}" for call in CALLS]


def register(engine: object) -> None:
    """Tell an MLIR ExecutionEngine (before its first lookup) where the calls are: the runtime's
    wrapped functions (it is loaded first)."""
    library = load()
    for call in CALLS:
        engine.raw_register_runtime(call, ctypes.cast(getattr(library, WRAPPED + call), ctypes.c_void_p))


def computing_threads() -> int:
    """Threads that run a step's parallel loops: the pool's and the caller."""
    return int(load().mlirnn_runtime_threads())


def pool_threads_started() -> int:
    """Pool threads started in this process (they start with the first team)."""
    return int(load().mlirnn_runtime_started_threads())


def teams_forked() -> int:
    """Parallel loops run by more than one thread in this process so far."""
    return int(load().mlirnn_runtime_teams_forked())


def step_runner() -> int:
    """The address of the runtime's ``mlirnn_runtime_run_step`` for a threaded step's calls (the
    thin call's runner), or 0 where they all run on every computing thread: one thread,
    or ``MLIR_NN_TEAM_WIDTH=all``."""
    if num_threads() < 2 or not width_measured():
        return 0
    return ctypes.cast(load().mlirnn_runtime_run_step, ctypes.c_void_p).value or 0


def team_choice(workspace: np.ndarray) -> dict[str, int | str | None]:
    """What the runtime measured for the calls on ``workspace`` (a step's, at one batch size):
    calls on the caller alone and on every thread, the median of each one's last times (ns), the
    width in use (None until both are measured) and the calls between probes of the other."""
    if workspace.nbytes < CHOICE_OFFSET + CHOICE_BYTES:
        raise ValueError(f"a workspace of {workspace.nbytes} bytes has no team choice")
    out = (ctypes.c_longlong * 6)()
    load().mlirnn_runtime_choice_report(workspace.ctypes.data + CHOICE_OFFSET, out)
    alone, every, alone_ns, every_ns, using, probe_every = out
    return {"calls_alone": alone, "calls_all": every, "alone_ns": alone_ns, "all_ns": every_ns,
            "using": None if using < 0 else ("all" if using else "alone"), "probe_every": probe_every}
