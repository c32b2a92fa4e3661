"""Backends that run a Graph. Each registers a factory under its public name."""

from __future__ import annotations

from collections.abc import Callable

from mlir_nn.backends.base import Backend, Executable

_FACTORIES: dict[str, Callable[[], Backend]] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    _FACTORIES[name] = factory


def get_backend(name: str) -> Backend:
    """The backend called ``name``; raises ValueError listing the known ones."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(sorted(_FACTORIES))}") from None
    return factory()


def _reference() -> Backend:
    from mlir_nn.backends.reference import ReferenceBackend

    return ReferenceBackend()


def _cpu() -> Backend:
    from mlir_nn.backends.cpu import CpuBackend

    return CpuBackend()


register_backend("numpy", _reference)
register_backend("cpu", _cpu)


def _cuda() -> Backend:
    from mlir_nn.backends.cuda import CudaBackend

    return CudaBackend()


register_backend("cuda", _cuda)

__all__ = ["Backend", "Executable", "get_backend", "register_backend"]
