"""Worker processes that compile the chunks of a split step in parallel.

The MLIR and LLVM bindings hold the GIL, so threads cannot share the work: each worker is
a fresh Python process (``python -m mlir_nn.backends.kernel_pool``, never a fork) that
reads pickled ``kernel_build.Job``s from stdin and answers each with the module's LLVM
text or the error. Workers start on the first compile that uses them (the jit pipeline starts
them before the e-graph optimizer, so that they have imported MLIR when LLVM starts) and
serve every later one in the process; they are stopped when it exits. The calling process
builds chunks too, whenever no worker is free. ``$MLIR_NN_COMPILE_WORKERS`` sets how many
(at most 8; 0 compiles in the calling process). The default is one per core beyond the
caller's that this process may run on; the compile process of a tiered step gets one fewer
(``mlir_nn.jit.tiered``): the interpreter tier runs meanwhile on another core. (Before the
caller built chunks itself, a 2-core machine had no worker by default: workers took the
cores that the caller's lowering needed, autoencoder 9.1 s with 2 workers, 7.8 s without.
With one worker started before the optimizer and the caller building too, a 2-core machine's
time to optimized code, fresh processes interleaved, median of 3: 1x256 Adam 2.31 -> 1.87 s
(LLVM stage 1.31 -> 0.68), 16x256 Adam 5.12 -> 4.59, the autoencoder 5.04 -> 3.61.)
A worker that dies or fails is not trusted: its job is redone in the calling process,
which raises the real error. One compile at a time uses the workers (a lock); a forked
child starts its own.
"""

from __future__ import annotations

import atexit
import os
import pickle
import selectors
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # it imports MLIR: loading a cached step does without
    from mlir_nn.backends.kernel_build import Job

WORKERS_VARIABLE = "MLIR_NN_COMPILE_WORKERS"
MAX_WORKERS = 8
_HEADER = struct.Struct("<Q")


def default_count(beside: int = 0) -> int:
    """One worker per core, of those this process may run on, beyond the caller's and ``beside``
    others (at most 8)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(MAX_WORKERS, cores - 1 - beside))


def worker_count() -> int:
    """``$MLIR_NN_COMPILE_WORKERS`` (default ``default_count()``, at most 8); a bad value is a ValueError."""
    text = os.environ.get(WORKERS_VARIABLE, "").strip()
    if not text:
        return default_count()
    if not text.isdigit():
        raise ValueError(f"{WORKERS_VARIABLE} must be a number of processes (0 compiles in this one), got {text!r}")
    return min(MAX_WORKERS, int(text))


def _send(stream: object, payload: object) -> None:
    data = pickle.dumps(payload)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: object) -> object:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("worker closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("worker closed its pipe")
    return pickle.loads(data)


class _Worker:
    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        self.process = subprocess.Popen([sys.executable, "-m", "mlir_nn.backends.kernel_pool"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, env=env)
        self.owner = os.getpid()

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.process.poll() is None

    def stop(self) -> None:
        if self.owner == os.getpid() and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_WORKERS: list[_Worker] = []
_LOCK = threading.Lock()  # one compile at a time talks to the workers


def start(count: int | None = None) -> None:
    """Start workers up to ``count`` (default ``worker_count()``) ahead of a compile; they import
    MLIR while the caller lowers."""
    count = worker_count() if count is None else count
    with _LOCK:
        _WORKERS[:] = [w for w in _WORKERS if w.alive()]
        while len(_WORKERS) < count:
            try:
                _WORKERS.append(_Worker())
            except OSError:  # no process: the caller compiles in its own
                return


@atexit.register
def stop_all() -> None:
    for worker in _WORKERS:
        worker.stop()
    _WORKERS.clear()


def _forget_after_fork() -> None:
    global _LOCK
    _WORKERS.clear()  # the parent's workers and pipes are not the child's
    _LOCK = threading.Lock()  # another thread may have held it


os.register_at_fork(after_in_child=_forget_after_fork)


def run(jobs: Sequence[Job]) -> list[str]:
    """Build every job (its object file) and return their LLVM texts, in order: on the workers
    and in this process, which builds the jobs that no worker is free for (all of them when
    there is no worker); a job a worker failed is redone here."""
    from mlir_nn.backends.kernel_build import build

    texts: list[str | None] = [None] * len(jobs)
    with _LOCK:
        workers = [w for w in _WORKERS if w.alive()][:len(jobs) - 1]
        if workers:
            _on_workers(jobs, workers, texts)
    for i, job in enumerate(jobs):
        if texts[i] is None:
            texts[i] = build(job)
    return texts  # type: ignore[return-value]


def _on_workers(jobs: Sequence[Job], workers: list[_Worker], texts: list[str | None]) -> None:
    """Hand the jobs out, largest first, to whichever worker is free, building one here whenever
    none is; leave failed ones None (one that failed here is redone by ``run``, which raises
    its error once no worker is busy)."""
    from mlir_nn.backends.kernel_build import build

    pending = sorted(range(len(jobs)), key=lambda i: -len(jobs[i].chunk.text))
    selector = selectors.DefaultSelector()
    busy: dict[int, int] = {}

    def hand_out(worker: _Worker) -> None:
        if not pending:
            return
        index = pending.pop(0)
        try:
            _send(worker.process.stdin, jobs[index])
        except OSError:
            worker.stop()
            pending.insert(0, index)
            return
        busy[id(worker)] = index
        selector.register(worker.process.stdout, selectors.EVENT_READ, worker)

    try:
        for worker in workers:
            hand_out(worker)
        while busy or pending:
            if pending:
                index = pending.pop(0)
                try:
                    texts[index] = build(jobs[index])
                except Exception:  # noqa: BLE001 - redone by run, which raises it
                    pass
            for key, _ in selector.select(timeout=0 if pending else None):
                worker = key.data
                selector.unregister(key.fileobj)
                index = busy.pop(id(worker))
                try:
                    ok, text = _receive(worker.process.stdout)
                except (EOFError, OSError, pickle.UnpicklingError):
                    worker.stop()
                    continue
                if ok:
                    texts[index] = text
                hand_out(worker)
    except BaseException:  # interrupted: a busy worker's answer would be read as the next compile's
        for worker in workers:
            if id(worker) in busy:
                worker.stop()
        raise
    finally:
        selector.close()


def _serve() -> None:
    """The worker: build jobs from stdin until it closes; answers go to the original stdout
    (anything LLVM prints goes to stderr). It first warms LLVM up (its targets and pass
    registries: ~0.2 s on the first compile) while the caller is still lowering."""
    from mlir_nn.backends.kernel_build import build, warm_up

    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    warm_up()
    requests = sys.stdin.buffer
    while True:
        try:
            job = _receive(requests)
        except EOFError:
            return
        try:
            reply = (True, build(job))
        except Exception as error:  # noqa: BLE001 - reported to the caller, which redoes the job
            reply = (False, f"{type(error).__name__}: {error}")
        _send(replies, reply)


if __name__ == "__main__":
    _serve()
