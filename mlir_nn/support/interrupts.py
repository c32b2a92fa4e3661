"""Interrupts deferred over a block that must run whole (a commit of several parameters).

Python runs signal handlers in the main thread between bytecodes, so a Ctrl-C can land
between two writes of a Python loop. Inside ``interrupts_deferred()`` a SIGINT is recorded
instead, and handed to the handler that was installed before once the block has ended
(a KeyboardInterrupt by default), so the block either did not start or finished.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block with SIGINT held back; deliver one that arrived when it ends. Other threads
    than the main one receive no signals, so there the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            _deliver(previous, *pending[0])


def _deliver(handler: object, signum: int, frame: FrameType | None) -> None:
    """What ``handler`` (as ``signal.signal`` returned it) does with the signal."""
    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)
    # SIG_IGN, or a handler installed outside Python (None): nothing to do from here
