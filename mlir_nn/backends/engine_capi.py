"""MLIR's C API called by ctypes, which releases the GIL: its ExecutionEngine, and the
translation of an LLVM-dialect module to LLVM IR (for ``llvm_jit``).

The Python binding's ``ExecutionEngine`` holds the GIL while LLVM translates and compiles, so
two engines on two threads compile one after the other. Called here, a thread that compiles
leaves the GIL to another, which compiles another module meanwhile: the native first tier's
split step compiles its kernels on one core and its step on the other
(``kernel_build.compile_resident_split``).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import TYPE_CHECKING

from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.mlir_preload import LIBRARY
from mlir_nn.backends.native import package_file

if TYPE_CHECKING:
    from mlir import ir


class StringRef(ctypes.Structure):
    """MLIR's ``MlirStringRef``."""

    _fields_ = [("data", ctypes.c_char_p), ("length", ctypes.c_size_t)]

    @classmethod
    def of(cls, text: str) -> StringRef:
        data = text.encode()
        return cls(data, len(data))


class _Api:
    """The few C functions used, from MLIR's C API library (loaded already by ``mlir.ir``).
    Every handle (``MlirModule``, ``MlirExecutionEngine``: a struct of one pointer) passes as a
    pointer."""

    def __init__(self, library: ctypes.CDLL) -> None:
        pointer = ctypes.c_void_p
        self.create = bind(library, "mlirExecutionEngineCreate", pointer,
                           pointer, ctypes.c_int, ctypes.c_int, pointer, ctypes.c_bool, ctypes.c_bool)
        self.destroy = bind(library, "mlirExecutionEngineDestroy", None, pointer)
        self.lookup = bind(library, "mlirExecutionEngineLookup", pointer, pointer, StringRef)
        self.register_translations = bind(library, "mlirRegisterAllLLVMTranslations", None, pointer)
        self.translate = bind(library, "mlirTranslateModuleToLLVMIR", pointer, pointer, pointer)


def bind(library: ctypes.CDLL, name: str, restype: object, *argtypes: object) -> ctypes._CFuncPtr:
    """The C function ``name`` of ``library`` with its result and argument types set."""
    function = getattr(library, name)
    function.restype, function.argtypes = restype, list(argtypes)
    return function


@cache
def api() -> _Api:
    path = package_file("mlir", f"_mlir_libs/{LIBRARY}")
    if path is None:
        raise NativeError(f"{LIBRARY} not found in the mlir package")
    return _Api(ctypes.CDLL(str(path)))


_capsule_pointer = bind(ctypes.pythonapi, "PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)


def handle(capsule_owner: object, kind: str) -> int:
    """The C handle inside an ``ir.Module``/``ir.Operation``/``ir.Context`` (``kind``)."""
    return _capsule_pointer(capsule_owner._CAPIPtr, f"mlir.ir.{kind}._CAPIPtr".encode())


def translate(module: ir.Module, llvm_context: int) -> int:
    """``module`` (LLVM dialect) translated to an LLVM IR module in ``llvm_context``; 0 on failure."""
    api().register_translations(handle(module.context, "Context"))
    return api().translate(handle(module.operation, "Operation"), llvm_context)


class Engine:
    """An ExecutionEngine holding one LLVM-dialect module, compiled at its first ``lookup``;
    destroyed (its code freed) with this object. ``module`` must outlive the constructor only."""

    def __init__(self, module: ir.Module, opt_level: int, name: str) -> None:
        self.name = name  # what it compiles, for errors
        self._api = api()
        self._handle = self._api.create(handle(module, "Module"), opt_level, 0, None, False, True)
        if not self._handle:
            raise NativeError(f"LLVM JIT of {name} failed: the engine was not created")

    def lookup(self, symbol: str) -> int:
        """The address of ``symbol`` (the first lookup compiles the module)."""
        address = self._api.lookup(self._handle, StringRef.of(symbol))
        if not address:
            raise NativeError(f"LLVM JIT of {self.name}: symbol {symbol} not found in the compiled code")
        return address

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self._api.destroy(self._handle)
