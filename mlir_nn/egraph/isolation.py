"""Where egglog runs: one thread at a time, its e-graphs freed on the thread that made
them, and never inside a process forked after egglog ran in its parent.

* egglog's e-graphs may only be dropped on the thread that created them, and they sit
  in reference cycles, so the garbage collector of any other thread could find them.
  ``on_this_thread`` runs one optimization at a time with automatic collection paused,
  then collects its garbage itself, on its own thread.
* A fork copies only the forking thread, and egglog's native state can be left locked:
  a forked child that runs egglog after the parent did can hang forever (e.g. a
  ``multiprocessing`` fork pool training new models). Such a child hands the work to a
  fresh interpreter (``python -m mlir_nn.egraph.isolation``) through pickles on its pipes.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mlir_nn.support.collection import collection_paused
from mlir_nn.support.interrupts import interrupts_deferred

_LOCK = threading.Lock()
_state = {"ran": False, "running": False, "forked_after_run": False}


def _after_fork_in_child() -> None:
    global _LOCK
    _state["forked_after_run"] = _state["forked_after_run"] or _state["ran"] or _state["running"]
    _state["running"] = False
    _LOCK = threading.Lock()  # a thread of the parent may have held it; it does not exist here


os.register_at_fork(after_in_child=_after_fork_in_child)


def must_use_fresh_process() -> bool:
    """True in a process forked after egglog ran in its parent (or an ancestor)."""
    return _state["forked_after_run"]


@contextmanager
def _paused_gc() -> Iterator[None]:
    """Automatic collection paused (in every thread: ``support.collection``), then this
    thread's e-graphs freed here, on this thread."""
    with collection_paused():
        try:
            yield
        finally:
            with interrupts_deferred():  # a Ctrl-C in a finalizer would be printed and lost
                gc.collect()


def on_this_thread(work: Callable[[], Any]) -> Any:
    """``work()`` (which uses egglog), serialized with every other use in this process."""
    with _LOCK:
        _state["running"] = True
        try:
            with _paused_gc():
                result = work()
        finally:
            _state["running"], _state["ran"] = False, True
        return result


def in_fresh_process(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` run by a new interpreter; ``function`` is a module-level
    function, which the interpreter imports by name (pickle's reference to it)."""
    payload = pickle.dumps((function, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    done = subprocess.run([sys.executable, "-m", "mlir_nn.egraph.isolation"], input=payload,
                          capture_output=True, check=False)
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the e-graph optimizer's fresh process failed ({done.returncode}): {detail[0]}")
    return pickle.loads(done.stdout)


def _serve() -> None:
    function, args, kwargs = pickle.loads(sys.stdin.buffer.read())
    result = function(*args, **kwargs)
    sys.stdout.buffer.write(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    _serve()
