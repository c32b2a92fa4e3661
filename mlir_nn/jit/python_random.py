"""Python randomness while tracing: a traced step would freeze the numbers drawn once.

``watch()`` is a context manager around a trace. It installs a profile hook in this
thread only (other threads and the rest of the program are untouched):

* a call of a C method of Python's ``random`` generators (``random.randint`` and friends
  end in one) raises ``PythonRandomError`` at once, naming the user's line;
* NumPy's generators run as compiled extension code that the hook does not see called,
  so their states are compared instead: NumPy's global generator (``np.random.rand``...)
  and every ``Generator``/``RandomState`` a user function can see (its globals, locals,
  and ``self``'s attributes) are recorded when the function is entered; when user code
  calls into mlir-nn (a tensor op) or returns with one of them advanced, the error names
  that line or function.

Draws made by mlir-nn itself are not reported (calls from its code are skipped, and
states advanced inside its functions are accepted when they return to user code). When
another profiler is active the hook is not installed and only the global generators'
states are compared before and after the trace.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import numpy as np

from mlir_nn.support.user_frame import describe, in_package, is_library, user_frame

_NUMPY_GENERATORS = (np.random.Generator, np.random.RandomState)


class PythonRandomError(RuntimeError):
    """Python randomness inside a traced step: it would run once, while tracing."""


def _message(where: str) -> str:
    return (f"Python randomness at {where} while mlir_nn.jit traces the step: it runs once, while tracing, "
            "so every call of the compiled step would reuse the numbers drawn then (a frozen choice). "
            "Draw the numbers outside the step and pass them in as arguments, run this code eagerly, or "
            "pass allow_python_random=True to mlir_nn.jit if one fixed draw is what you want.")


def _frozen(value: Any) -> Any:
    """A generator state as something comparable with ==."""
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in sorted(value.items()))
    if isinstance(value, np.ndarray):
        return value.tobytes()
    return value


def _state(generator: Any) -> Any:
    if isinstance(generator, np.random.RandomState):
        return _frozen(generator.get_state(legacy=False))
    return _frozen(generator.bit_generator.state)


class _Watcher:
    """The profile hook's state for one trace."""

    def __init__(self) -> None:
        self.kinds: dict[CodeType, str] = {}
        self.scanned: set[int] = set()
        self.generators: dict[int, tuple[Any, Any]] = {}
        self._add(np.random.mtrand._rand)

    def _add(self, generator: Any) -> None:
        if id(generator) not in self.generators:
            self.generators[id(generator)] = (generator, _state(generator))

    def _kind(self, code: CodeType) -> str:
        kind = self.kinds.get(code)
        if kind is None:
            filename = code.co_filename
            kind = self.kinds[code] = "package" if in_package(filename) else "other" if is_library(filename) else "user"
        return kind

    def _scan(self, values: Any) -> None:
        for value in values:
            if isinstance(value, _NUMPY_GENERATORS):
                self._add(value)

    def _enter(self, frame: FrameType) -> None:
        if id(frame.f_globals) not in self.scanned:
            self.scanned.add(id(frame.f_globals))
            self._scan(list(frame.f_globals.values()))
        local = list(frame.f_locals.values())
        self._scan(local)
        for value in local:
            attributes = getattr(value, "__dict__", None)
            if isinstance(attributes, dict):
                self._scan(list(attributes.values()))

    def advanced(self) -> bool:
        return any(_state(g) != state for g, state in self.generators.values())

    def _accept(self) -> None:
        self.generators = {key: (g, _state(g)) for key, (g, _) in self.generators.items()}

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            if isinstance(getattr(arg, "__self__", None), random.Random):
                caller = user_frame(frame)
                if caller is not None and not in_package(caller.f_code.co_filename):
                    raise PythonRandomError(_message(describe(caller)))
        elif event == "call":
            kind = self._kind(frame.f_code)
            if kind == "user":
                self._enter(frame)
            elif kind == "package" and self._called_from_user(frame) and self.advanced():
                raise PythonRandomError(_message(describe(frame.f_back) + " (a NumPy random generator was drawn "
                                                 "from on this line or before it in the function)"))
        elif event == "return":
            kind = self._kind(frame.f_code)
            if kind == "user" and self.advanced():
                code = frame.f_code
                raise PythonRandomError(_message(f"{code.co_filename}:{code.co_firstlineno} in {code.co_name} "
                                                 "(a NumPy random generator was drawn from in this function)"))
            if kind == "package" and self._called_from_user(frame):
                self._accept()  # mlir-nn's own draws

    def _called_from_user(self, frame: FrameType) -> bool:
        return frame.f_back is not None and self._kind(frame.f_back.f_code) == "user"


def _global_states() -> tuple[Any, Any]:
    return random.getstate(), _state(np.random.mtrand._rand)


@contextmanager
def watch(allow: bool) -> Iterator[None]:
    """Raise ``PythonRandomError`` for Python randomness inside the block (unless ``allow``)."""
    if allow:
        yield
        return
    if sys.getprofile() is None:
        watcher = _Watcher()
        sys.setprofile(watcher.hook)
        try:
            yield
        finally:
            sys.setprofile(None)
        if watcher.advanced():
            raise PythonRandomError(_message("a line of the step (a NumPy random generator was drawn from)"))
        return
    before = _global_states()
    yield
    if _global_states() != before:
        raise PythonRandomError(_message("a line of the step (another profiler is active: the line is unknown)"))
