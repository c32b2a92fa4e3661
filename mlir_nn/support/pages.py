"""Large zeroed buffers on small pages, faulted in on another core.

numpy asks the kernel for transparent huge pages (``madvise``) for every array from 4 MiB on.
On a virtual machine that hands freed memory back to its host (free page reporting), the first
write to a fresh 2 MiB page may wait for the host: a fresh process first touched a 64 MiB
``np.zeros`` array in 14-530 ms (depending on what the host had taken back), on 4 KiB pages
in 80-93 ms (2 vCPUs of a Zen 5 EPYC; on bare metal the two cost about the same). A step's
workspace and an optimizer's state are fresh memory that its first call writes: here they are
mappings of their own on small pages, which a background thread faults in while the step
traces and compiles. The native first tier's first call of 16x1024 MLPs at batch 128, fresh
processes alternated, medians of 3: Adam 1108 -> 792 ms, SGD 442 -> 411; the large step of
``benchmarks/grid.py`` ran as fast as before (12.2-12.5 ms either way).
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
_work: queue.SimpleQueue = queue.SimpleQueue()  # arrays whose pages to fault in
_worker: threading.Thread | None = None  # the thread doing it, while there is work


def _fault_in() -> None:
    """The worker: fault each array's pages in, on another core and without the GIL (where the
    kernel has no MADV_POPULATE_WRITE nothing happens: the first writes fault them in as usual);
    it ends when no work is left."""
    global _worker
    while True:
        with _LOCK:
            try:
                array = _work.get_nowait()
            except queue.Empty:
                _worker = None
                return
        _LIBC.madvise(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), MADV_POPULATE_WRITE)
        del array  # the mapping may go once populated


def _submit(array: np.ndarray) -> None:
    global _worker
    with _LOCK:
        _work.put(array)
        if _worker is None:
            _worker = threading.Thread(target=_fault_in, name="mlir_nn-pages", daemon=True)
            _worker.start()


def _forget_worker() -> None:
    """In a forked child: the worker thread did not come along, nor its work."""
    global _work, _worker, _LOCK
    _work, _worker, _LOCK = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_forget_worker)


def wait_populated() -> None:
    """Until every mapping made so far is faulted in and the worker has ended (nothing needs to
    wait for it: populating leaves the contents alone, so a step may write the pages meanwhile)."""
    with _LOCK:
        worker = _worker
    if worker is not None:
        worker.join()


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
    return zeroed_bytes(math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)
