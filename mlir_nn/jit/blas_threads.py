"""BLAS threads of the interpreter tier: no more than the cores its compile processes leave free.

NumPy's BLAS (OpenBLAS) runs each matrix product on one thread per core. While a tiered
step's compile process runs, one of those threads shares a core with it, and every product
waits for that thread: on a busy 2-core machine an interpreted 8x64 MLP step (Adam, batch
128) took 71 ms with 2 BLAS threads and 4.3 ms with one. Calls from several threads at once
share the setting (the last restores it); only speed depends on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any


@cache
def _libraries() -> list[Any]:
    """threadpoolctl's controllers of the BLAS libraries loaded (found once: it scans the
    process's libraries)."""
    from threadpoolctl import ThreadpoolController

    return [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]


@contextmanager
def limited(count: int) -> Iterator[None]:
    """BLAS on at most ``count`` threads (at least 1) inside; the previous counts after."""
    changed = [(lib, lib.num_threads) for lib in _libraries() if lib.num_threads > max(1, count)]
    for lib, _ in changed:
        lib.set_num_threads(max(1, count))
    try:
        yield
    finally:
        for lib, before in changed:
            lib.set_num_threads(before)
