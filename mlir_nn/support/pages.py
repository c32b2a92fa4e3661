"""Large zeroed buffers on small pages, which a fresh process faults in several times faster.

numpy asks the kernel for transparent huge pages (``madvise``) for every array from 4 MiB on.
On a virtual machine that hands freed memory back to its host (free page reporting), the first
write to each fresh 2 MiB page waits for the host: a fresh process first touched a 64 MiB
``np.zeros`` array in 440-590 ms, on 4 KiB pages in 41-94 ms (2 vCPUs of a Zen 5 EPYC; on
bare metal the two cost about the same). A step's workspace and an optimizer's state are
fresh memory that its first call touches: 16x1024 MLPs at batch 128 in a fresh process, the
native first tier's first call, SGD 550-630 -> 405-420 ms, Adam 0.8-1.3 -> 0.82-0.85 s. Their
steps afterwards did not measurably slow (``benchmarks/grid.py --only 784-1024``).
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import queue
import threading

import numpy as np

HUGE_PAGES_FROM = 1 << 22  # numpy's threshold for asking for huge pages
MADV_POPULATE_WRITE = 23  # Linux 5.14 on: fault the range in, writable, leaving what it holds as it is
_LIBC = ctypes.CDLL(None, use_errno=True)  # a CDLL call releases the GIL
_LOCK = threading.Lock()
_queue: queue.SimpleQueue | None = None  # arrays to fault in (and Events to set), for the worker thread


def _fault_in(work: queue.SimpleQueue) -> None:
    """The worker: fault each array's pages in, on another core and without the GIL; where the
    kernel has no MADV_POPULATE_WRITE nothing happens (the first writes fault them in as usual)."""
    while True:
        item = work.get()
        if isinstance(item, threading.Event):
            item.set()
        else:
            _LIBC.madvise(ctypes.c_void_p(item.ctypes.data), ctypes.c_size_t(item.nbytes), MADV_POPULATE_WRITE)
        del item  # the mapping may go once populated


def _submit(item: np.ndarray | threading.Event) -> None:
    global _queue
    with _LOCK:
        if _queue is None:
            _queue = queue.SimpleQueue()
            threading.Thread(target=_fault_in, args=(_queue,), name="mlir_nn-pages", daemon=True).start()
        _queue.put(item)


def _forget_worker() -> None:
    """In a forked child: the worker thread did not come along."""
    global _queue, _LOCK
    _queue, _LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_worker)


def wait_populated() -> None:
    """Until every mapping made so far is faulted in (for tests: nothing else needs to wait, since
    populating leaves the contents alone and a step may write the pages meanwhile)."""
    done = threading.Event()
    _submit(done)
    done.wait()


def zeroed_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` zero bytes as a writable uint8 array; from ``HUGE_PAGES_FROM`` on a private
    anonymous mapping of its own (page aligned, 4 KiB pages unless the system makes every
    mapping huge, unmapped when the array and its views are gone) that a background thread
    faults in at once, while this one goes on (tracing and compiling the step that will write
    it). MemoryError when the system refuses it."""
    if nbytes < HUGE_PAGES_FROM:
        return np.zeros(nbytes, np.uint8)
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError, ValueError) as error:
        raise MemoryError(f"{nbytes} bytes cannot be mapped: {error}") from None
    array = np.frombuffer(mapping, np.uint8)
    _submit(array)
    return array


def zeros(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """``np.zeros(shape, dtype)`` with its memory from ``zeroed_bytes``."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    if count * dtype.itemsize < HUGE_PAGES_FROM:
        return np.zeros(shape, dtype)
    return zeroed_bytes(count * dtype.itemsize).view(dtype).reshape(shape)
