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
Hyperparameter values are not structure: they are fed on every call (``mlir_nn.jit.feeds``).

Comparing structure keys walks every parameter, so it is done only after a structural
change may have happened: modules and optimizers call ``structure_changed()`` when an
attribute is set, the list of layers they made (``TrackedList``) or the optimizer state
(``TrackedDict``) changes, or a term switches on or off. Objects whose key depends on
anything else (``structure_tracked()`` false or missing: user-defined modules that
override ``parameters()``, or a plain list assigned in place of a tracked one) have
their keys compared on every call.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

Getter = Callable[[], Any]
_MISSING = object()
_version = 0  # bumped by structure_changed()


def structure_changed() -> None:
    """Note that some module's or optimizer's structure may have changed: the next check of
    every step compares structure keys again. (Concurrent bumps may merge; the count still moves.)"""
    global _version
    _version += 1


def _reporting(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, then ``structure_changed()``."""
    @functools.wraps(method)
    def changed(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        structure_changed()
        return result
    return changed


class TrackedList(list):
    """A list that calls ``structure_changed()`` whenever it is modified (a module's layers)."""

    __setitem__ = _reporting(list.__setitem__)
    __delitem__ = _reporting(list.__delitem__)
    __iadd__ = _reporting(list.__iadd__)
    __imul__ = _reporting(list.__imul__)
    append = _reporting(list.append)
    extend = _reporting(list.extend)
    insert = _reporting(list.insert)
    pop = _reporting(list.pop)
    remove = _reporting(list.remove)
    clear = _reporting(list.clear)
    sort = _reporting(list.sort)
    reverse = _reporting(list.reverse)


class TrackedDict(dict):
    """A dict that calls ``structure_changed()`` whenever it is modified (an optimizer's state)."""

    __setitem__ = _reporting(dict.__setitem__)
    __delitem__ = _reporting(dict.__delitem__)
    __ior__ = _reporting(dict.__ior__)
    pop = _reporting(dict.pop)
    popitem = _reporting(dict.popitem)
    clear = _reporting(dict.clear)
    setdefault = _reporting(dict.setdefault)
    update = _reporting(dict.update)


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
        getters += [functools.partial(namespace.get, name, _MISSING) for name in _global_names(code)]
    getters += [functools.partial(_contents, cell) for cell in getattr(target, "__closure__", None) or ()]
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
        version = _version
        getters = self._roots + [g for root in self._roots for g in _held(root(), root)]
        objects = [get() for get in getters]
        keys = [_key(o) for o in objects]
        self._objects = [o for o, k in zip(objects, keys) if k is not None]  # modules and optimizers
        self._same = [(get, obj) for get, obj in zip(getters, objects)]  # every object, by identity
        self._keyed = [(obj, key) for obj, key in zip(objects, keys) if key is not None]
        self._checked_version = version if self._all_tracked() else None

    def _all_tracked(self) -> bool:
        """True when every keyed object reports each change of its key (``structure_changed``)."""
        for obj, _ in self._keyed:
            is_tracked = getattr(obj, "structure_tracked", None)
            if not (callable(is_tracked) and is_tracked()):
                return False
        return True

    def parameter_dtype(self) -> str | None:
        """The dtype of the first parameter of a referenced module or optimizer, if any."""
        for obj in self._objects:
            params = getattr(obj, "parameters", None)
            params = params() if callable(params) else params
            if params:
                return params[0].dtype
        return None

    def holds(self) -> bool:
        """True when every referenced object is the same one with the same structure key (keys
        compared only when a structural change may have happened since they last were)."""
        for get, obj in self._same:
            if get() is not obj:
                return False
        if self._checked_version == _version:
            return True
        version = _version  # read first: a change during the comparison is seen next time
        for obj, key in self._keyed:
            if obj.structure_key() != key:
                return False
        self._checked_version = version if self._all_tracked() else None
        return True
