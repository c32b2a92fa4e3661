"""Containers: ``Sequential``, ``ModuleList`` and ``ModuleDict``, as PyTorch's.

Children are registered under their position (``"0"``, ``"1"``...) or key, so a
Sequential's state_dict keys are ``0.weight``, ``1.running_mean``... Every change goes
through ``Module``'s registration and is reported to ``mlir_nn.jit.guards``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from mlir_nn.jit.guards import structure_changed
from mlir_nn.nn.module import Module


def _module(owner: str, value: Any) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{owner}: {type(value).__name__} is not a Module")
    return value


class _Indexed(Module):
    """Children kept in ``_modules`` under "0".."n-1" (renumbered after inserts and deletes)."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def _index(self, i: int) -> int:
        n = len(self._modules)
        if not isinstance(i, int) or not -n <= i < n:
            raise IndexError(f"{type(self).__name__}: index {i!r} is out of range for {n} modules")
        return i % n

    def _renumber(self, modules: list[Module]) -> None:
        self._modules.clear()
        self._modules.update((str(i), m) for i, m in enumerate(modules))
        structure_changed()

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def __getitem__(self, i: int | slice) -> Any:
        items = list(self._modules.values())
        if isinstance(i, slice):
            return type(self)(*items[i]) if isinstance(self, Sequential) else type(self)(items[i])
        return items[self._index(i)]

    def __setitem__(self, i: int, module: Module) -> None:
        self._modules[list(self._modules)[self._index(i)]] = _module(type(self).__name__, module)
        structure_changed()

    def __delitem__(self, i: int | slice) -> None:
        items = list(self._modules.values())
        del items[i if isinstance(i, slice) else self._index(i)]
        self._renumber(items)

    def append(self, module: Module) -> Any:
        self._modules[str(len(self._modules))] = _module(type(self).__name__, module)
        structure_changed()
        return self

    def extend(self, modules: Iterable[Module]) -> Any:
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, _module(type(self).__name__, module))
        self._renumber(items)

    def pop(self, index: int = -1) -> Module:
        module = self[index]
        del self[index]
        return module

    def __iadd__(self, modules: Iterable[Module]) -> Any:
        return self.extend(modules)

    def __dir__(self) -> list[str]:
        return [k for k in super().__dir__() if not k.isdigit()]


class ModuleList(_Indexed):
    """A list of modules, registered as children ``0``, ``1``...; it has no forward."""


class Sequential(_Indexed):
    """Modules applied in order: ``Sequential(Linear(2, 8), ReLU(), Linear(8, 1))``, or from an
    ordered mapping of names to modules."""

    def __init__(self, *modules: Module | Mapping[str, Module]) -> None:
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            super().__init__()
            for name, m in modules[0].items():
                self.add_module(name, _module("Sequential", m))
        else:
            super().__init__(modules)  # type: ignore[arg-type]

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleDict(Module):
    """A dict of modules, registered as children under their keys; it has no forward."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, _module("ModuleDict", module))

    def __delitem__(self, key: str) -> None:
        del self._modules[key]
        structure_changed()

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> list[str]:
        return list(self._modules)

    def values(self) -> list[Module]:
        return list(self._modules.values())

    def items(self) -> list[tuple[str, Module]]:
        return list(self._modules.items())

    def pop(self, key: str) -> Module:
        module = self._modules.pop(key)
        structure_changed()
        return module

    def clear(self) -> None:
        self._modules.clear()
        structure_changed()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for key, m in (modules.items() if isinstance(modules, Mapping) else modules):
            self[key] = m
