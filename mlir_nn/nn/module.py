"""``nn.Module`` and ``nn.Parameter`` with PyTorch's semantics.

A ``Parameter`` or a ``Module`` assigned as an attribute is registered (in order of first
assignment); ``register_buffer`` adds state that is saved but not trained (BatchNorm's
running statistics, updated in place with ``Tensor.assign``, so also inside a compiled
step). ``state_dict()`` keys and order are PyTorch's: a module's own parameters, then its
buffers, then each child's under ``child.``.

Beyond PyTorch, so that no model ends up silently without parameters, a plain list or tuple
attribute holding modules counts as a container of children (``layers.0.W``), as
``ModuleList`` would; such a module reports ``structure_tracked() == False`` since changes
to the list are not reported, and ``mlir_nn.jit`` compares its structure on every call.
A plain ``Tensor`` assigned to the name of a registered parameter replaces it (tinynn's
``layer.W = Tensor(...)``), where PyTorch would raise.

``structure_key()`` names what a traced step bakes in: the modules, their parameter and
buffer tensors (identity and dtype), and their plain settings (``training``, ``p`` of
Dropout, ``eps``...). Every change made through attribute assignment is reported to
``mlir_nn.jit.guards``, so a compiled step re-traces after ``model.eval()``,
``model.drop.p = 0.2`` or ``model.fc = nn.Linear(...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from mlir_nn.engine import Tensor, state_array
from mlir_nn.ir.shapes import dtype_name
from mlir_nn.jit.guards import structure_changed
from mlir_nn.runtime import residency
from mlir_nn.support.domains import check_domain

_SETTING_TYPES = (bool, int, float, str, type(None))


class Parameter(Tensor):
    """A tensor that a ``Module`` registers as a trainable parameter when assigned as an attribute."""

    def __init__(self, data: Any, label: str = "", dtype: Any = None) -> None:
        super().__init__(data, label=label, dtype=dtype)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(strict=False)`` did not match (PyTorch's return value)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _is_setting(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_setting(v) for v in value)
    return isinstance(value, _SETTING_TYPES)


class Module:
    """Base class of layers and models: subclasses assign parameters and submodules in
    ``__init__`` and compute in ``forward``; calling the module runs ``forward``."""

    training: bool
    STATE_DOMAINS: dict[str, str] = {}  # this module's state entries -> the values a loaded one may hold

    def __new__(cls, *args: Any, **kwargs: Any) -> Module:
        """Create the registries before any ``__init__`` runs (a subclass that forgets
        ``super().__init__()`` still works)."""
        self = super().__new__(cls)
        state = self.__dict__
        state["_parameters"], state["_buffers"], state["_modules"] = {}, {}, {}
        state["_non_persistent"] = set()
        state["training"] = True
        return self

    def __init__(self) -> None:
        pass

    # ------------------------------------------------------------------ registration

    def __setattr__(self, name: str, value: Any) -> None:
        """Register parameters and modules, update buffers, report a possible change of structure."""
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter) or (name in params and isinstance(value, Tensor)):
            self._forget(name)
            params[name] = value
        elif isinstance(value, Module):
            self._forget(name)
            modules[name] = value
        elif value is None and (name in params or name in modules or name in buffers):
            (params if name in params else modules if name in modules else buffers)[name] = None
        elif name in buffers:
            if not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}: cannot assign {type(value).__name__} as buffer "
                                f"{name!r} (a Tensor or None expected)")
            buffers[name] = value
        else:
            self._forget(name)
            object.__setattr__(self, name, value)
        structure_changed()

    def __getattr__(self, name: str) -> Any:
        """Registered parameters, buffers and modules (called only when normal lookup fails)."""
        state = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            found = state.get(registry, {})
            if name in found:
                return found[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        if not self._forget(name):
            object.__delattr__(self, name)
        structure_changed()

    def _forget(self, name: str) -> bool:
        """Drop ``name`` from every registry (and the plain attributes); True if it was registered."""
        found = False
        for registry in (self._parameters, self._buffers, self._modules):
            found = registry.pop(name, _ABSENT) is not _ABSENT or found
        self._non_persistent.discard(name)
        self.__dict__.pop(name, None)
        return found

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is not None and not isinstance(param, Tensor):
            raise TypeError(f"{type(self).__name__}.register_parameter: {name!r} must be a Parameter or None, "
                            f"got {type(param).__name__}")
        self._check_name("register_parameter", name)
        self._forget(name)
        self._parameters[name] = param
        structure_changed()

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """Add state that is saved (unless not ``persistent``) but not trained; an array becomes a Tensor."""
        if tensor is not None and not isinstance(tensor, Tensor):
            if not isinstance(tensor, np.ndarray):
                raise TypeError(f"{type(self).__name__}.register_buffer: {name!r} must be a Tensor, an array or "
                                f"None, got {type(tensor).__name__}")
            tensor = Tensor(tensor)
        self._check_name("register_buffer", name)
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)
        structure_changed()

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__}.add_module: {name!r} must be a Module or None, "
                            f"got {type(module).__name__}")
        self._check_name("add_module", name)
        self._forget(name)
        self._modules[name] = module
        structure_changed()

    register_module = add_module

    def _check_name(self, what: str, name: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"{type(self).__name__}.{what}: name must be a non-empty string without '.', got {name!r}")

    # ------------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ------------------------------------------------------------------ walking

    def named_children(self) -> list[tuple[str, Module]]:
        """Direct submodules: registered ones, then the modules in plain list/tuple attributes."""
        children = [(name, m) for name, m in self._modules.items() if m is not None]
        for name, value in self.__dict__.items():
            if isinstance(value, (list, tuple)):
                children += [(f"{name}.{i}", m) for i, m in enumerate(value) if isinstance(m, Module)]
        return children

    def children(self) -> list[Module]:
        return [m for _, m in self.named_children()]

    def named_modules(self, prefix: str = "") -> list[tuple[str, Module]]:
        """This module and every submodule, depth first (each once), with dotted names."""
        found: list[tuple[str, Module]] = []
        seen: set[int] = set()

        def visit(module: Module, name: str) -> None:
            if id(module) in seen:
                return
            seen.add(id(module))
            found.append((name, module))
            for child_name, child in module.named_children():
                visit(child, f"{name}.{child_name}" if name else child_name)

        visit(self, prefix)
        return found

    def modules(self) -> list[Module]:
        return [m for _, m in self.named_modules()]

    def _named_members(self, registry: str, recurse: bool) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) of one registry over this module (and its submodules), each tensor once."""
        found, seen = [], set()
        for prefix, module in self.named_modules() if recurse else [("", self)]:
            for name, t in getattr(module, registry).items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    found.append((f"{prefix}.{name}" if prefix else name, t))
        return found

    def named_parameters(self, recurse: bool = True) -> list[tuple[str, Tensor]]:
        """(dotted name, parameter), e.g. ``0.weight`` in a Sequential; a shared one once."""
        return self._named_members("_parameters", recurse)

    def parameters(self, recurse: bool = True) -> list[Tensor]:
        return [p for _, p in self.named_parameters(recurse)]

    def named_buffers(self, recurse: bool = True) -> list[tuple[str, Tensor]]:
        return self._named_members("_buffers", recurse)

    def buffers(self, recurse: bool = True) -> list[Tensor]:
        return [t for _, t in self.named_buffers(recurse)]

    # ------------------------------------------------------------------ modes and helpers

    def train(self, mode: bool = True) -> Module:
        """Training mode (``mode``) for this module and every submodule; returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"{type(self).__name__}.train: mode must be a bool, got {type(mode).__name__}")
        for module in self.modules():
            module.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            p.grad = 0

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """``fn`` on every submodule (children first), then on this module; returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, dtype: Any) -> Module:
        """Parameters and buffers converted to ``dtype`` in place (each keeps its identity); returns self."""
        name = dtype_name(dtype)
        tensors = self.parameters() + self.buffers()
        residency.fetch([t.data for t in tensors])
        for t in tensors:
            t._data = t.data.astype(name)
        residency.written([t.data for t in tensors])
        structure_changed()
        return self

    def double(self) -> Module:
        return self.to(np.float64)

    def float(self) -> Module:
        return self.to(np.float32)

    # ------------------------------------------------------------------ structure (mlir_nn.jit.guards)

    def structure_key(self) -> tuple:
        """What a traced step of this module bakes in: each module (identity and plain settings),
        its parameter and buffer tensors (identity and dtype)."""
        key: list[Any] = []
        for module in self.modules():
            settings = tuple((k, v) for k, v in module.__dict__.items() if not k.startswith("_") and _is_setting(v))
            key.append((id(module), settings))
        key += [(id(t), t.dtype) for t in self.parameters() + self.buffers()]
        return tuple(key)

    def structure_tracked(self) -> bool:
        """True when every change of ``structure_key()`` is reported to ``mlir_nn.jit.guards``: no module
        computes its parameters its own way or keeps modules in a plain list (whose changes no one reports)."""
        for module in self.modules():
            cls = type(module)
            if cls.parameters is not Module.parameters or cls.named_children is not Module.named_children:
                return False
            if any(isinstance(v, (list, tuple)) and any(isinstance(m, Module) for m in v)
                   for v in module.__dict__.values()):
                return False
        return True

    # ------------------------------------------------------------------ saving and loading

    def _state_entries(self) -> list[tuple[str, Tensor]]:
        """(key, tensor) in PyTorch's state_dict order: own parameters, own persistent buffers, then children."""
        entries, seen = [], set()
        for prefix, module in self.named_modules():
            own = list(module._parameters.items()) + [(n, b) for n, b in module._buffers.items()
                                                      if n not in module._non_persistent]
            for name, t in own:
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    entries.append((f"{prefix}.{name}" if prefix else name, t))
        return entries

    def state_dict(self) -> dict[str, np.ndarray]:
        """{key: copy of the array} for parameters and persistent buffers, keys and shapes as
        PyTorch's (current also inside a resident block: newer device copies are fetched first)."""
        entries = self._state_entries()
        residency.fetch([t.data for _, t in entries])
        return {name: t.data.copy() for name, t in entries}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy ``state`` into the parameters and buffers in place; every entry is checked
        before any is written. Values may be NumPy arrays or anything ``np.asarray`` reads."""
        if not isinstance(state, Mapping):
            raise TypeError(f"{type(self).__name__}.load_state_dict: expected a dict of names to arrays (a "
                            f"state_dict()), got {type(state).__name__}")
        named = dict(self._state_entries())
        missing = [k for k in named if k not in state]
        unexpected = [k for k in state if k not in named]
        if strict and (missing or unexpected):
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected}")
        checked = {name: state_array(state[name], f"{type(self).__name__}.load_state_dict: {name}", t.dtype,
                                     t.shape)
                   for name, t in named.items() if name in state}
        for prefix, module in self.named_modules():
            for local, domain in module.STATE_DOMAINS.items():
                name = f"{prefix}.{local}" if prefix else local
                if name in checked:
                    check_domain(checked[name], domain, f"{type(self).__name__}.load_state_dict: {name}")
        for name, value in checked.items():
            named[name].data[...] = value
        residency.written([named[name].data for name in checked])  # device copies are stale now
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ printing

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(child).replace("\n", "\n  ") for name, child in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ")" if not lines else head + "\n  " + "\n  ".join(lines) + "\n)"


_ABSENT = object()
