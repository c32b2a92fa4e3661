"""Tiered execution: a new step runs on a first tier while another process compiles it.

A cold compile (egglog, the MLIR passes, LLVM) takes seconds, and the MLIR and LLVM
bindings hold the GIL, so a thread cannot hide it. Instead ``jit`` starts a fresh Python
process (``python -m mlir_nn.jit.tiered``, never a fork: a forked egglog or LLVM is not safe)
that optimizes and compiles the traced graph into the disk caches, and runs the first
calls on the NumPy reference interpreter meanwhile. Once the process has exited, the next
call loads the optimized graph and the native code from the caches and switches to it.
Both tiers update the same parameter arrays in place and agree within the compiled
backend's tolerances, so the switch is invisible to a training loop.

The first tier (``MLIR_NN_FIRST_TIER``): ``interpreter`` (the default) runs the traced
graph at once, without egglog or MLIR, on the reference ops with planned buffers
(``mlir_nn.backends.buffered``): its first call took 0.04-0.2 s on the MLPs of
``benchmarks/compile_time.py``, and an Adam step of the 784-256-64-16-64-256-784
autoencoder (batch 128, one BLAS thread) 7 ms against 3.9 ms for -O0 native code.
``native`` compiles the traced graph in this process, without egglog: a float32 step of the
ops the baseline compiler takes (``backends.baseline``: element-wise ops, sums, products,
transposes; the MLPs of ``compile_time.py`` with any of the optimizers) straight to LLVM IR,
compiled by LLVM at -O0 without MLIR (``compile_time.py --first-tier native``, Zen 3, load
1.1-1.2: first calls 0.04-0.82 s, 0.18x JAX's in geomean, against 0.39-1.10 s and 1.22x through
MLIR; its element-wise loops written 8 floats at a time, which -O0 keeps, its steps took
0.65-1.0x as long as MLIR's quick code below: 8x64 SGD 0.82 against 1.24 ms, 4x256 Adam 4.9-10
against 5.0-7.2, the autoencoder 10-11 against 12-30, load 2.4-2.6; at -O1 or -O2 its code
generation took 160-220 ms instead of 25-35 ms at 4x256 Adam, for steps no faster than the
vectors'); any other step with the cpu pipeline without threads
(``backends.cpu.serial_pipeline``: no compile workers, no split into kernels below
``QUICK_SPLIT_PRODUCTS`` products) and LLVM at ``QUICK_OPT_LEVEL`` (0: no IR optimization;
MLIR's engine runs the code generator at its default level whatever the -O level, and a true
-O0 through LLVM's C API, fast instruction selection and register allocation, took the 4x256 Adam step's LLVM stage from
0.32 to 0.16 s but its step from 1.7 to 15-21 ms; LLVM's code generator told through its
command-line options, -fast-isel, -regalloc=basic and no machine scheduling, took the 8x64 Adam
step's from 85-92 to 60-79 ms but its step from 0.40 to 0.42 ms, 0.1 s more over the ~5000 steps
before the optimized code comes), its float32 and float64 matrix products calls
of a precompiled C GEMM (``codegen.gemm_calls``, ``backends/gemm.c``; their schedules and vector
code had been about 60% of the 4x256 Adam step's quick compile: first call 0.82 -> 0.50 s, its
step 2.14 -> 2.03 ms), f32 exp and erf libm's (``inline_math``'s expansions vectorize only at -O1
and above), without the "linalg" and "llvm" stages' texts (``as_text`` waits for the optimized code),
its sums over the batch plain loops, its functions not tuned for the host (``host_cpu``: nothing
vectorizes at -O0), its code kept in the JIT that compiled it (no object file, link or load), and runs the
first calls on that until the optimized code is ready; the compile process starts only once
the first call has run, so that the quick compile and the first call's products (cut in two
halves on two threads: ``gemm.threads``) have the machine's cores (started with the quick
compile, on 2 cores at a load of 4-7, it doubled the quick first call, 1.2 -> 2.6 s at 1x16
Adam, and brought the optimized code no sooner, fresh processes interleaved; started before
the first call's products, which ran on one thread: first call 8x1024 SGD median 314 -> 285 ms
without it, 16x1024 Adam 780 -> 731, alternated fresh processes). Its first call on the Adam MLPs of
``compile_time.py --quick`` (1x16, 4x256, 8x64; 2 cores at a load of 6.5): 0.70, 1.71 and
1.88 s against 1.43, 2.13 and 2.15 s when it ran egglog and the whole cpu pipeline. Its steps
(one thread): 2.9 ms at 4x256 against 1.9 ms for the optimized code; the autoencoder's
5.0 ms against 3.0 (6.9 on the interpreter). The autoencoder's quick first call took 2.5 s,
and 200 of its steps took longer than on the interpreter, which stays the default.

``jit(..., tiered=False)`` or ``MLIR_NN_TIERED=0`` compiles before the first call instead.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

from mlir_nn.backends import kernel_pool
from mlir_nn.ir import Graph
from mlir_nn.support.switches import switch

ENV = "MLIR_NN_TIERED"
FIRST_TIER_ENV = "MLIR_NN_FIRST_TIER"
FIRST_TIERS = ("interpreter", "native")
# LLVM's -O level of the native first tier. -O1 (with the full schedule), traced Adam MLPs at batch 128,
# one thread, medians of 3 alternated: LLVM 0.42 -> 1.29 s and step 2.93 -> 1.87 ms at 4x256, 0.56 ->
# 1.72 s and 0.51 -> 0.27 ms at 8x64: it pays after 1000-5000 steps, later than the optimized code comes
QUICK_OPT_LEVEL = 0
# From this many matrix products on, the native first tier's step is split into kernels, each a
# function of its own (compiled here, on both cores: ``kernel_build.compile_resident_split``): LLVM's
# loop passes (loop strength reduction, freeze canonicalization) take superlinear time in the size of
# the one function of a whole step. Fresh processes alternated, Adam MLPs at batch 128, one thread,
# whole -> split, when the split step was one module on one core: first call
# 6x64 (20 products) 0.81 -> 0.72 s, 8x64 1.00 -> 0.86, 8x256 1.54 -> 1.16 (its step 7.6 -> 3.3 ms),
# 12x16 1.16 -> 1.03, 16x64 2.07 -> 1.41; below, the split's fixed cost (each kernel's tail of
# the pipeline and its own function) did not pay: 1x16 (5) 0.39 -> 0.49 s, 2x1024 (5) 0.67 -> 0.71,
# 4x256 (14) 0.95 -> 0.90-2.1, the autoencoder 784-256-64-16-64-256-784 (17) 1.09 -> 1.3-3.5 s.
QUICK_SPLIT_PRODUCTS = 20


def quick_split(graph: Graph) -> bool:
    """True when the native first tier splits ``graph``'s step into kernels (``QUICK_SPLIT_PRODUCTS``)."""
    return sum(node.op == "matmul" for node in graph.nodes) >= QUICK_SPLIT_PRODUCTS


def from_caches(graph: Graph, batch_estimate: int | None, optimize: bool) -> tuple[Graph, Any, Any] | None:
    """(optimized graph, optimizer report, cpu executable) when both disk caches hold this
    step already; None otherwise. Loads neither egglog nor MLIR (nor the cpu backend, when the
    optimizer's cache misses)."""
    optimized, report = graph, None
    if optimize:
        from mlir_nn.egraph.cache import load

        cached = load(graph, batch_estimate)
        if cached is None:
            return None
        optimized, report = cached
    from mlir_nn.backends.cpu import CpuBackend

    executable = CpuBackend().load_cached(optimized)
    return None if executable is None else (optimized, report, executable)


def tiered_default() -> bool:
    """``MLIR_NN_TIERED``: 1 (the default) or 0."""
    return switch(ENV, True)


def first_tier_default() -> str:
    """``MLIR_NN_FIRST_TIER``: ``interpreter`` (the default) or ``native``."""
    value = os.environ.get(FIRST_TIER_ENV, FIRST_TIERS[0]).strip()
    if value not in FIRST_TIERS:
        raise ValueError(f"{FIRST_TIER_ENV} must be {' or '.join(FIRST_TIERS)}, got {value!r}")
    return value


_LENGTH = "<Q"  # the pickled payload's length, before it in a compile process's input (``_feed``)
MAX_RUNNING = max(2, min(4, len(os.sched_getaffinity(0)) // 2 if hasattr(os, "sched_getaffinity") else 2))


def child_environment() -> dict[str, str]:
    """The compile process's environment: this package on its path and, unless the user set
    ``$MLIR_NN_COMPILE_WORKERS``, its workers leaving a core to this process's interpreter tier."""
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    if not env.get(kernel_pool.WORKERS_VARIABLE, "").strip():
        env[kernel_pool.WORKERS_VARIABLE] = str(kernel_pool.default_count(beside=1))
    return env


class BackgroundCompile:
    """A separate process that optimizes and compiles ``graph`` into the disk caches; one still
    running when this process exits is stopped (no orphans; its cache writes are atomic).

    At most ``MAX_RUNNING`` run at once (each holds egglog, MLIR and LLVM: ~120 MB); later
    ones wait in a queue, their steps on the interpreter, and start as earlier ones finish
    (checked whenever a waiting step is called) or when their step must wait for them. A
    ``held`` one joins the queue at ``release`` (the native first tier's first call runs before
    it, on both cores), or starts when its step waits for it."""

    def __init__(self, graph: Graph, batch_estimate: int | None, optimize: bool, held: bool = False) -> None:
        self._owner = os.getpid()  # a forked child neither waits for nor stops its parent's compile
        payload = pickle.dumps((graph, batch_estimate, optimize))
        self._payload = struct.pack(_LENGTH, len(payload)) + payload
        self._started = False
        self._process: subprocess.Popen | None = None
        self._feeding: threading.Thread | None = None  # writes the payload into the process's stdin
        self.held = held
        if not held:
            self.release()

    def release(self) -> None:
        """Queue the compile (if it was held), to start once fewer than ``MAX_RUNNING`` run."""
        with _QUEUE_LOCK:
            queue = not self._started and self not in _QUEUE
            if queue:
                _QUEUE.append(self)
            self.held = False
        if queue:
            _start_waiting()

    def _start(self) -> None:
        """Start the process (called with ``_QUEUE_LOCK`` held, once)."""
        self._started = True
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "mlir_nn.jit.tiered"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_environment())
        except OSError:  # no process: done() is true at once and the caller compiles in this one
            return
        _RUNNING.add(self)
        self._feeding = threading.Thread(target=_feed, args=(self._process.stdin, self._payload),
                                         name="mlir_nn-compile-input", daemon=True)
        self._feeding.start()

    @property
    def started(self) -> bool:
        return self._started

    def _exited(self) -> bool:
        return self._started and (self._process is None or self._process.poll() is not None)

    def done(self) -> bool:
        """True once the process has exited (successfully or not), or this is a forked child
        of the process that started it; never blocks (a queued compile may start here)."""
        if os.getpid() != self._owner:
            return True
        if not self._started:
            _start_waiting()
        return self._exited()

    def wait(self, timeout: float | None = None) -> None:
        """Until the process has exited; a queued one starts now."""
        if os.getpid() != self._owner:
            return
        with _QUEUE_LOCK:
            if not self._started:
                if self in _QUEUE:
                    _QUEUE.remove(self)
                self.held = False
                self._start()
        if not self._exited():
            self._process.wait(timeout)

    def cancel(self) -> None:
        with _QUEUE_LOCK:
            if not self._started:
                if self in _QUEUE:
                    _QUEUE.remove(self)
                self._started = True  # never to run: done() is true
                return
        if os.getpid() == self._owner and not self._exited():
            self._process.kill()
            self._process.wait()


_RUNNING: weakref.WeakSet[BackgroundCompile] = weakref.WeakSet()
_QUEUE: list[BackgroundCompile] = []  # not started yet, oldest first
_QUEUE_LOCK = threading.Lock()


def running() -> int:
    """How many compile processes of this process run now."""
    return sum(1 for b in list(_RUNNING) if b._owner == os.getpid() and not b._exited())


def _start_waiting() -> None:
    """Start queued compiles while fewer than ``MAX_RUNNING`` of this process run."""
    with _QUEUE_LOCK:
        count = running()
        while _QUEUE and count < MAX_RUNNING:
            _QUEUE.pop(0)._start()
            count += 1


def _feed(pipe: Any, payload: bytes) -> None:
    """Write a compile process's input into its pipe and close it, on a thread of its own: a
    payload over the pipe's 64 KiB blocks until the process, still importing, reads it (a 16x16
    Adam MLP's step, 0.11 s of its first call). The payload starts with its length (``_LENGTH``):
    the process reads that many bytes, not up to an end of file that a child forked meanwhile,
    holding the pipe open, would keep from coming."""
    try:
        pipe.write(payload)
        pipe.close()
    except OSError:  # it died at start: done() says so, and the caller compiles in process
        pass


def _forget_queue_after_fork() -> None:
    global _QUEUE_LOCK
    _QUEUE_LOCK = threading.Lock()  # another thread of the parent may have held it
    _QUEUE.clear()  # the parent's steps wait for these, not the child's


os.register_at_fork(after_in_child=_forget_queue_after_fork)


@atexit.register
def _stop_running() -> None:
    for background in list(_RUNNING):
        background.cancel()


def _compile_into_caches() -> None:
    """The child process: read (graph, batch estimate, optimize) from stdin, fill the caches
    (and build the cpu backend's call extension, so that the switch does not wait for cc)."""
    from mlir_nn.backends import thin_call
    from mlir_nn.backends.cpu import compile_kernel, prepare_compile

    head = sys.stdin.buffer.read(struct.calcsize(_LENGTH))
    graph, batch_estimate, optimize = pickle.loads(sys.stdin.buffer.read(struct.unpack(_LENGTH, head)[0]))
    prepare_compile()
    if optimize:
        from mlir_nn.egraph.cache import optimize_cached

        graph, _ = optimize_cached(graph, batch_estimate)
    compile_kernel(graph)
    thin_call.extension()


if __name__ == "__main__":
    _compile_into_caches()
