"""The MPI communicator (through mpi4py): init, rank, size and the few collectives we use.

Every collective is non-blocking underneath and waited for with a deadline, so a rank
that died or hangs makes the others raise ``DistributedTimeout`` instead of waiting
forever; such a process then aborts the MPI job when it exits (MPI_Finalize would wait
for the missing rank), so ``mpiexec`` ends with an error. So does a rank that ends with
an uncaught exception, at once.

Outside ``init()`` nothing here touches MPI: ``rank()`` is 0, ``size()`` 1 and
``allreduce_mean`` returns its arguments, so single-process code runs unchanged.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from mlir_nn.ir.ops import COLLECTIVE_REFERENCES

DEFAULT_TIMEOUT = 60.0  # seconds a collective may wait for the other ranks
COMPILE_TIMEOUT = 900.0  # seconds ranks may wait for each other to finish compiling a step
ABORT_GRACE_SECONDS = 0.5
SPIN_SECONDS = 0.002  # a pending collective is polled without pause this long, then yields between polls


class DistributedError(RuntimeError):
    """A distributed setup that cannot work (no MPI, no init(), ranks that disagree)."""


class DistributedTimeout(DistributedError):
    """A collective did not complete in time: another rank died or is stuck."""


class _State:
    comm: Any = None  # mpi4py's COMM_WORLD once init() ran
    timeout: float = DEFAULT_TIMEOUT
    broken = False  # a collective timed out: abort the job at exit instead of finalizing


_state = _State()
_local = threading.local()  # per-thread sample weight (see sample_weight)


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(
            f"mlir_nn.distributed needs mpi4py and an MPI library: pip install -e '.[dist]' ({e})"
        ) from None
    return MPI


def init(timeout: float = DEFAULT_TIMEOUT) -> None:
    """Start MPI (once; later calls only change ``timeout``). Launch with ``mpiexec -n N``;
    a plain ``python`` run is a world of one rank."""
    if timeout <= 0:
        raise ValueError(f"distributed.init: timeout must be positive seconds, got {timeout}")
    _state.timeout = float(timeout)
    if _state.comm is None:
        _state.comm = _mpi().COMM_WORLD
        atexit.register(_abort_if_broken)
        sys.excepthook = _aborting_excepthook(sys.excepthook)


def _aborting_excepthook(previous: Any) -> Any:
    """An uncaught exception on one rank aborts the job at exit: the other ranks would
    otherwise wait for it until their collectives time out."""

    def hook(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        previous(kind, value, traceback)
        _state.broken = True

    return hook


def is_initialized() -> bool:
    return _state.comm is not None


def require_init(what: str) -> Any:
    """The communicator, or a DistributedError saying ``what`` needs init() first."""
    if _state.comm is None:
        raise DistributedError(f"{what}: call mlir_nn.distributed.init() first (and launch with mpiexec -n N)")
    return _state.comm


def rank() -> int:
    return 0 if _state.comm is None else _state.comm.Get_rank()


def size() -> int:
    return 1 if _state.comm is None else _state.comm.Get_size()


def _abort_if_broken() -> None:
    if _state.broken and _state.comm is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_SECONDS)  # lets mpiexec forward this rank's last output before the abort
        _state.comm.Abort(1)


def _wait(request: Any, what: str, timeout: float | None = None) -> None:
    """Wait for ``request`` at most ``timeout`` seconds (init's by default); on timeout mark
    the job broken and raise.

    Polls without pause for a moment (the usual case: the others are about to arrive), then
    yields the core between polls, so a waiting rank does not take the core from a rank
    still computing when there are fewer cores than processes."""
    if request.Test():
        return
    timeout = _state.timeout if timeout is None else timeout
    start = time.monotonic()
    spin_until, deadline = start + SPIN_SECONDS, start + timeout
    while not request.Test():
        now = time.monotonic()
        if now > spin_until:
            os.sched_yield()
        if now > deadline:
            _state.broken = True
            raise DistributedTimeout(
                f"{what}: rank {rank()} of {size()} waited {timeout:g} s for the other ranks; "
                "one of them died or is stuck (the MPI job is aborted when this process exits)"
            )


@contextlib.contextmanager
def sample_weight(weight: float) -> Iterator[None]:
    """Weight of this rank's values in the allreduce means run inside the block (default 1).
    With each rank's sample count as its weight, the mean of per-rank batch means is the
    mean over all samples, even when ranks hold different numbers of samples."""
    if weight < 0:
        raise ValueError(f"sample_weight: weight must be >= 0, got {weight}")
    previous = getattr(_local, "weight", 1.0)
    _local.weight = float(weight)
    try:
        yield
    finally:
        _local.weight = previous


def current_weight() -> float:
    return getattr(_local, "weight", 1.0)


def allreduce_mean(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The weighted mean of each array over all ranks, in one collective: sum(w_r * x_r) / sum(w_r).

    The arrays are packed into one buffer of their common dtype with the weight as its
    last element, so a whole gradient set costs one MPI call."""
    if _state.comm is None or size() == 1:
        return list(arrays)
    weight = current_weight()
    dtype = np.result_type(*arrays)
    total = sum(a.size for a in arrays)
    send = np.empty(total + 1, dtype)
    offset = 0
    for a in arrays:
        np.multiply(a.reshape(-1), weight, out=send[offset:offset + a.size], casting="unsafe")
        offset += a.size
    send[total] = weight
    received = np.empty_like(send)
    _wait(_state.comm.Iallreduce(send, received), "allreduce_mean")
    if received[total] <= 0:
        raise DistributedError("allreduce_mean: the sample weights of all ranks sum to zero")
    out, offset = [], 0
    for a in arrays:
        mean = np.empty(a.shape, a.dtype)
        np.divide(received[offset:offset + a.size].reshape(a.shape), received[total], out=mean, casting="unsafe")
        out.append(mean)
        offset += a.size
    return out


def synchronize(what: str, timeout: float) -> None:
    """Wait until every rank got here (at most ``timeout`` seconds, or init's if longer)."""
    comm = require_init(what)
    _wait(comm.Ibarrier(), what, max(timeout, _state.timeout))


def broadcast(array: np.ndarray, root: int = 0) -> None:
    """Overwrite ``array`` (C-contiguous) on every rank with the root's, in place."""
    comm = require_init("broadcast")
    if not 0 <= root < size():
        raise ValueError(f"broadcast: root {root} is not a rank of this world of {size()}")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("broadcast: the array must be C-contiguous and writable")
    _wait(comm.Ibcast(array, root=root), "broadcast")


def allgather(value: Any) -> list[Any]:
    """Every rank's ``value`` (any picklable Python value), in rank order."""
    comm = require_init("allgather")
    payload = np.frombuffer(pickle.dumps(value), np.uint8)
    sizes = np.empty(size(), np.int64)
    _wait(comm.Iallgather(np.array([payload.size], np.int64), sizes), "allgather")
    gathered = np.empty(int(sizes.sum()), np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    _wait(comm.Iallgatherv(payload, [gathered, sizes, offsets, _mpi().BYTE]), "allgather")
    return [pickle.loads(gathered[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]


COLLECTIVE_REFERENCES["allreduce_mean"] = lambda x: allreduce_mean([x])[0]
