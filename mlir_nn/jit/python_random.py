"""Python randomness while tracing: a traced step would freeze the numbers drawn once.

``without_python_random`` runs a trace and compares, before and after, the states of the
generators the step function can reach (Python's and NumPy's global ones, and the
generators held by its globals, closure and ``self``, two attributes deep). Only when one
moved does it put them back and trace again under ``watch()`` to name the line.

``watch()`` installs a profile hook in this thread only (other threads and the rest of
the program are untouched):

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
another profiler holds the hook, the error cannot name the line.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any, TypeVar

import numpy as np

from mlir_nn.support.user_frame import describe, in_package, is_library, user_frame

_NUMPY_GENERATORS = (np.random.Generator, np.random.RandomState)
_GENERATORS = (*_NUMPY_GENERATORS, random.Random)
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
T = TypeVar("T")


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


def _generators_seen_by(fn: Callable[..., Any]) -> list[Any]:
    """NumPy generators and ``random.Random`` instances the function can reach cheaply: its
    globals, closure and ``self``, and their attributes (and the items of lists, tuples and
    dicts held there), plus the global generators of both libraries."""
    found: dict[int, Any] = {id(np.random.mtrand._rand): np.random.mtrand._rand}
    target = inspect.unwrap(fn)
    roots: list[Any] = []
    if isinstance(target, types.MethodType):
        roots.append(target.__self__)
        target = target.__func__
    roots += list(getattr(target, "__globals__", {}).values())
    for cell in getattr(target, "__closure__", None) or ():
        with contextlib.suppress(ValueError):
            roots.append(cell.cell_contents)

    def visit(value: Any, depth: int) -> None:
        if isinstance(value, _GENERATORS):
            found[id(value)] = value
        elif depth and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth - 1)
        elif depth and isinstance(value, dict):
            for item in value.values():
                visit(item, depth - 1)
        elif depth and not isinstance(value, _OPAQUE) and isinstance(getattr(value, "__dict__", None), dict):
            for item in list(vars(value).values()):
                visit(item, depth - 1)

    for root in roots:
        visit(root, 2)
    return list(found.values())


def _snapshot(generators: list[Any]) -> list[Any]:
    return [random.getstate()] + [g.getstate() if isinstance(g, random.Random) else
                                  g.get_state() if isinstance(g, np.random.RandomState) else
                                  g.bit_generator.state for g in generators]


def _restore(generators: list[Any], states: list[Any]) -> None:
    random.setstate(states[0])
    for g, state in zip(generators, states[1:]):
        if isinstance(g, random.Random):
            g.setstate(state)
        elif isinstance(g, np.random.RandomState):
            g.set_state(state)
        else:
            g.bit_generator.state = state


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(_frozen(x) == _frozen(y) if isinstance(x, dict) else
                                    _frozen_tuple(x) == _frozen_tuple(y) for x, y in zip(a, b))


def _frozen_tuple(state: Any) -> Any:
    return tuple(v.tobytes() if isinstance(v, np.ndarray) else _frozen_tuple(v) if isinstance(v, tuple) else v
                 for v in state) if isinstance(state, tuple) else state


def without_python_random(fn: Callable[..., Any], trace: Callable[[], T], allow: bool) -> T:
    """``trace()`` (which runs ``fn`` symbolically), refusing Python randomness unless ``allow``.

    The trace first runs as it is, with the states of the generators ``fn`` can reach compared
    before and after (cheap). Only when one moved are their states put back and the trace run
    again under ``watch``, which names the line (or accepts draws made by mlir-nn itself).
    """
    if allow:
        return trace()
    generators = _generators_seen_by(fn)
    before = _snapshot(generators)
    result = trace()
    if _same(before, _snapshot(generators)):
        return result
    _restore(generators, before)
    with watch():
        return trace()


@contextmanager
def watch() -> Iterator[None]:
    """Raise ``PythonRandomError`` for Python randomness inside the block, naming the line (a
    profile hook, see the module docstring; when another profiler holds the hook, without it)."""
    if sys.getprofile() is not None:
        raise PythonRandomError(_message("a line of the step (another profiler is active: the line is unknown)"))
    watcher = _Watcher()
    sys.setprofile(watcher.hook)
    try:
        yield
    finally:
        sys.setprofile(None)
    if watcher.advanced():
        raise PythonRandomError(_message("a line of the step (a NumPy random generator was drawn from)"))
