"""Python's cyclic garbage collector paused over a block, counted across threads.

A cold compile makes hundreds of thousands of short-lived objects (MLIR's handles, pass
texts, the code generator's tuples) whose reference counts free them; the collector still
ran dozens of times over a compile, once over every object of the process (MLIR's modules
had just been imported): 30-40 ms of the native first tier's 8x64 Adam compile. egglog's
e-graphs, which sit in cycles, must be collected on the thread that made them
(``egraph.isolation``), so the collector resumes only once no thread holds a pause.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_holders: dict[int, int] = {}  # thread id -> how many pauses it holds
_resume = [False]  # whether the collector was enabled when the first pause began


@contextmanager
def collection_paused() -> Iterator[None]:
    """Run the block without automatic collection; it resumes (if it was on before the first
    pause) when the last pause of any thread ends."""
    me = threading.get_ident()
    with _LOCK:
        if not _holders:
            _resume[0] = gc.isenabled()
            gc.disable()
        _holders[me] = _holders.get(me, 0) + 1
    try:
        yield
    finally:
        with _LOCK:
            _holders[me] -= 1
            if not _holders[me]:
                del _holders[me]
            if not _holders and _resume[0]:
                gc.enable()


def _after_fork_in_child() -> None:
    """Only the forking thread lives on in the child: the pauses of the others are gone."""
    global _LOCK
    _LOCK = threading.Lock()
    me = threading.get_ident()
    for thread in [t for t in _holders if t != me]:
        del _holders[thread]
    if not _holders and _resume[0]:
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)
