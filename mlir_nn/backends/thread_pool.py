"""How many threads run the tasks of compiled steps.

``MLIR_NN_NUM_THREADS`` sets the computing threads; the default is the number of cores
this process may run on (``os.sched_getaffinity``). The task runtime (``task_runtime``)
starts one pool thread fewer: the thread that calls a step is the first thread of each
parallel loop's team, so a step keeps every core busy without a thread more than there are cores.
A step's calls run on all of them or on the caller alone, whichever the runtime measures faster
(``task_runtime.c``: "Team width by measurement"); ``MLIR_NN_TEAM_WIDTH=all`` keeps every call
on all of them.
"""

from __future__ import annotations

import os

ENV = "MLIR_NN_NUM_THREADS"
WIDTH_ENV = "MLIR_NN_TEAM_WIDTH"
WIDTHS = ("measured", "all")


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def num_threads() -> int:
    """Computing threads: ``MLIR_NN_NUM_THREADS`` or the cores this process may use."""
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


def width_measured() -> bool:
    """Whether a threaded step's calls run on the team width the runtime measures faster
    (``MLIR_NN_TEAM_WIDTH``: "measured", the default, or "all")."""
    text = os.environ.get(WIDTH_ENV, "").strip() or WIDTHS[0]
    if text not in WIDTHS:
        raise ValueError(f"{WIDTH_ENV}={text!r}: expected one of {', '.join(WIDTHS)}")
    return text == WIDTHS[0]
