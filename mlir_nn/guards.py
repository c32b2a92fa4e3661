"""What invalidates a traced step, checked cheaply before every call.

A trace bakes in structure: which tensors are the step's parameters, which optimizer
updates them and how, which ops run. ``StructureGuard`` records what the step function
refers to directly (the globals it loads, its closure variables, ``self`` of a bound
method) and, one attribute deep, the modules and optimizers those objects hold. Each such
object is compared by identity, and objects with a ``structure_key()`` (``Module``:
its parameter tensors; ``Optimizer``: class, parameters, state tensors, which optional
terms are on) by that key too. Rebinding a referenced name, replacing a parameter
(``layer.W = Tensor(...)``), adding or removing layers, replacing the optimizer or
clearing its state therefore makes ``holds()`` false, and ``mlir_nn.jit`` re-traces.
Hyperparameter values are not structure: they are fed on every call (``mlir_nn.feeds``).
"""

from __future__ import annotations

import dis
import inspect
import types
from collections.abc import Callable
from typing import Any

Getter = Callable[[], Any]
_MISSING = object()
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _global_names(code: types.CodeType) -> list[str]:
    """Names ``code`` loads as globals."""
    return list(dict.fromkeys(i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"))


def _root_getters(fn: Callable[..., Any]) -> list[Getter]:
    """Getters for what ``fn`` refers to directly."""
    getters: list[Getter] = []
    target = inspect.unwrap(fn)
    if isinstance(target, types.MethodType):
        owner = target.__self__
        getters.append(lambda: owner)
        target = target.__func__
    code, namespace = getattr(target, "__code__", None), getattr(target, "__globals__", {})
    if code is not None:
        getters += [(lambda n=name: namespace.get(n, _MISSING)) for name in _global_names(code)]
    for cell in getattr(target, "__closure__", None) or ():
        getters.append(lambda c=cell: _contents(c))
    return getters


def _contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return _MISSING


def _key(obj: Any) -> Any:
    structure = getattr(obj, "structure_key", None)
    return structure() if callable(structure) and not isinstance(obj, type) else None


def _held(obj: Any, root: Getter) -> list[Getter]:
    """Getters for the attributes of ``obj`` (a plain object) that have a structure key."""
    if isinstance(obj, _OPAQUE) or _key(obj) is not None or not hasattr(obj, "__dict__"):
        return []
    return [(lambda n=name: getattr(root(), n, _MISSING)) for name, value in vars(obj).items()
            if _key(value) is not None]


class StructureGuard:
    """A snapshot of the structure a step was traced with; ``holds()`` re-checks it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        roots = _root_getters(fn)
        self._roots = roots
        self.snapshot()

    def snapshot(self) -> None:
        """Record the current structure (after a trace, which may have created optimizer state)."""
        getters = self._roots + [g for root in self._roots for g in _held(root(), root)]
        objects = [get() for get in getters]
        self._getters, self._objects, self._keys = getters, objects, [_key(o) for o in objects]

    def parameter_dtype(self) -> str | None:
        """The dtype of the first parameter of a referenced module or optimizer, if any."""
        for obj, key in zip(self._objects, self._keys):
            params = getattr(obj, "parameters", None) if key is not None else None
            params = params() if callable(params) else params
            if params:
                return params[0].dtype
        return None

    def holds(self) -> bool:
        """True when every referenced object is the same one with the same structure key."""
        for get, obj, key in zip(self._getters, self._objects, self._keys):
            now = get()
            if now is not obj or (key is not None and _key(now) != key):
                return False
        return True
