"""An LLVM-dialect module compiled by LLVM's own JIT (ORC's LLJIT) with the code generator at
-O0: fast instruction selection and register allocation. Through LLVM's C API by ctypes (the
GIL released, as ``engine_capi``).

MLIR's ExecutionEngine runs LLVM's code generator at its default level whatever the -O level
it is given, which suits kernels (their loops) but not a split step's own function: only
calls of kernels with their arguments (pointers and sizes loaded at entry, live across every
call), where greedy register allocation took most of the time. The native first tier compiles
that function here (``kernel_build.compile_resident_split``).
"""

from __future__ import annotations

import ctypes
import platform
from functools import cache, partial
from typing import TYPE_CHECKING

from mlir_nn.backends import engine_capi
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.mlir_preload import LLVM_LIBRARY
from mlir_nn.backends.native import package_file

if TYPE_CHECKING:
    from mlir import ir

_CODEGEN_NONE, _RELOC_PIC, _CODE_MODEL_JIT_DEFAULT = 0, 2, 1  # LLVMCodeGenOptLevel, LLVMRelocMode, LLVMCodeModel
_REPORTER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)  # LLVMOrcErrorReporterFunction
_TARGETS = {"x86_64": "X86", "amd64": "X86", "aarch64": "AArch64", "arm64": "AArch64"}


class _Api:
    """The LLVM C functions used (LLVMErrorRef and every handle pass as pointers)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, text = ctypes.c_void_p, ctypes.c_char_p
        pp = ctypes.POINTER(ctypes.c_void_p)

        bind = partial(engine_capi.bind, library)

        self.context_create = bind("LLVMContextCreate", p)
        self.context_dispose = bind("LLVMContextDispose", None, p)
        self.dispose_module = bind("LLVMDisposeModule", None, p)
        self.default_triple = bind("LLVMGetDefaultTargetTriple", p)
        self.host_cpu = bind("LLVMGetHostCPUName", p)
        self.host_features = bind("LLVMGetHostCPUFeatures", p)
        self.dispose_message = bind("LLVMDisposeMessage", None, p)
        self.target_from_triple = bind("LLVMGetTargetFromTriple", ctypes.c_int, p, pp, pp)
        self.create_target_machine = bind("LLVMCreateTargetMachine", p, p, p, p, p, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_int)
        self.dispose_target_machine = bind("LLVMDisposeTargetMachine", None, p)
        self.set_target = bind("LLVMSetTarget", None, p, p)
        self.data_layout = bind("LLVMCreateTargetDataLayout", p, p)
        self.set_data_layout = bind("LLVMSetModuleDataLayout", None, p, p)
        self.dispose_data_layout = bind("LLVMDisposeTargetData", None, p)
        self.pass_options = bind("LLVMCreatePassBuilderOptions", p)
        self.dispose_pass_options = bind("LLVMDisposePassBuilderOptions", None, p)
        self.run_passes = bind("LLVMRunPasses", p, p, text, p, p)
        self.memory_buffer = bind("LLVMCreateMemoryBufferWithMemoryRangeCopy", p, text, ctypes.c_size_t, text)
        self.parse_ir = bind("LLVMParseIRInContext", ctypes.c_int, p, p, pp, pp)
        self.builder = bind("LLVMOrcCreateLLJITBuilder", p)
        self.machine_builder = bind("LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine", p, p)
        self.set_machine_builder = bind("LLVMOrcLLJITBuilderSetJITTargetMachineBuilder", None, p, p)
        self.create_jit = bind("LLVMOrcCreateLLJIT", p, pp, p)
        self.dispose_jit = bind("LLVMOrcDisposeLLJIT", p, p)
        self.main_dylib = bind("LLVMOrcLLJITGetMainJITDylib", p, p)
        self.session = bind("LLVMOrcLLJITGetExecutionSession", p, p)
        self.set_error_reporter = bind("LLVMOrcExecutionSessionSetErrorReporter", None, p, _REPORTER, p)
        self.global_prefix = bind("LLVMOrcLLJITGetGlobalPrefix", ctypes.c_char, p)
        self.process_symbols = bind("LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess", p, pp, ctypes.c_char,
                                    p, p)
        self.add_generator = bind("LLVMOrcJITDylibAddGenerator", None, p, p)
        self.safe_context = bind("LLVMOrcCreateNewThreadSafeContextFromLLVMContext", p, p)
        self.dispose_safe_context = bind("LLVMOrcDisposeThreadSafeContext", None, p)
        self.safe_module = bind("LLVMOrcCreateNewThreadSafeModule", p, p, p)
        self.add_module = bind("LLVMOrcLLJITAddLLVMIRModule", p, p, p, p)
        self.lookup = bind("LLVMOrcLLJITLookup", p, p, ctypes.POINTER(ctypes.c_uint64), text)
        self.error_message = bind("LLVMGetErrorMessage", p, p)
        self.dispose_error_message = bind("LLVMDisposeErrorMessage", None, p)
        target = _TARGETS.get(platform.machine().lower())
        if target is not None:  # (idempotent; MLIR's engine initializes the host's target too)
            for part in ("TargetInfo", "Target", "TargetMC", "AsmPrinter"):
                bind(f"LLVMInitialize{target}{part}", None)()

    def message(self, owned: int) -> str:
        """The text of a C string LLVM allocated, which is freed."""
        text = ctypes.string_at(owned).decode(errors="replace")
        self.dispose_message(owned)
        return text

    def error_text(self, error: int) -> str:
        """The message of an LLVMErrorRef, which is consumed."""
        owned = self.error_message(error)
        text = ctypes.string_at(owned).decode(errors="replace")
        self.dispose_error_message(owned)
        return text

    def check(self, error: int | None, what: str, reported: list[str] = ()) -> None:
        """Raise NativeError for a non-null LLVMErrorRef (consumed), with what the JIT's session
        ``reported`` meanwhile (the symbols it did not find)."""
        if error:
            raise NativeError(f"LLVM JIT of {what} failed: {'; '.join([*reported, self.error_text(error)])}")


@cache
def _api() -> _Api:
    package, library = LLVM_LIBRARY
    path = package_file(package, library)
    if path is None:
        raise NativeError(f"{library} not found in the {package} package")
    return _Api(ctypes.CDLL(str(path)))


def _target_machine(api: _Api, triple: str) -> int:
    """A TargetMachine for this host (``triple``), code generation at -O0, position-independent code."""
    target = ctypes.c_void_p()
    failure = ctypes.c_void_p()
    if api.target_from_triple(triple.encode(), ctypes.byref(target), ctypes.byref(failure)):
        raise NativeError(f"LLVM has no target for {triple}: {api.message(failure.value)}")
    cpu, features = api.message(api.host_cpu()), api.message(api.host_features())
    return api.create_target_machine(target, triple.encode(), cpu.encode(), features.encode(), _CODEGEN_NONE,
                                     _RELOC_PIC, _CODE_MODEL_JIT_DEFAULT)


class Jit:
    """``module`` (LLVM dialect) translated to LLVM IR, its ``always_inline`` functions inlined,
    or LLVM IR text (``baseline``) parsed, held in an LLJIT that compiles it at the first
    ``lookup`` at -O0; calls of functions it declares resolve to this process's symbols. Freed
    with this object. ``module`` must outlive the constructor only."""

    def __init__(self, module: ir.Module | str, name: str) -> None:
        self.name = name
        self._api = api = _api()
        self._jit = ctypes.c_void_p()
        self._triple = api.message(api.default_triple())
        machine = _target_machine(api, self._triple)
        layout = api.data_layout(machine)
        try:
            builder = api.builder()
            api.set_machine_builder(builder, api.machine_builder(machine))  # (each takes the one before)
            api.check(api.create_jit(ctypes.byref(self._jit), builder), name)
            self._reported: list[str] = []  # the session's errors, which it would print to stderr
            reported = self._reported  # (not self: no cycle keeps the JIT alive)
            self._reporter = _REPORTER(lambda _, error: reported.append(api.error_text(error)))
            api.set_error_reporter(api.session(self._jit), self._reporter, None)
            dylib = api.main_dylib(self._jit)
            generator = ctypes.c_void_p()
            api.check(api.process_symbols(ctypes.byref(generator), api.global_prefix(self._jit), None, None), name)
            api.add_generator(dylib, generator)
            api.check(api.add_module(self._jit, dylib, self._translated(module, layout)), name)
        finally:
            api.dispose_data_layout(layout)

    def _translated(self, module: ir.Module | str, layout: int) -> int:
        """``module`` as a thread-safe LLVM IR module for this host (``layout``), inlined."""
        api = self._api
        context = api.context_create()
        text = isinstance(module, str)
        llvm_module = self._parsed(module, context) if text else engine_capi.translate(module, context)
        if not llvm_module:
            api.context_dispose(context)
            raise NativeError(f"LLVM JIT of {self.name} failed: the module did not translate to LLVM IR")
        api.set_target(llvm_module, self._triple.encode())
        api.set_data_layout(llvm_module, layout)
        options = api.pass_options()
        error = api.run_passes(llvm_module, b"always-inline", None, options)
        api.dispose_pass_options(options)
        if error:
            api.dispose_module(llvm_module)
            api.context_dispose(context)
            api.check(error, self.name)
        safe_context = api.safe_context(context)  # (it takes the context, and the module takes both)
        safe_module = api.safe_module(llvm_module, safe_context)
        api.dispose_safe_context(safe_context)
        return safe_module

    def _parsed(self, text: str, context: int) -> int:
        """The LLVM IR ``text`` parsed in ``context``; a NativeError with LLVM's message if it is invalid."""
        api = self._api
        data = text.encode()
        buffer = api.memory_buffer(data, len(data), self.name.encode())  # (the parser takes it)
        module, message = ctypes.c_void_p(), ctypes.c_void_p()
        if api.parse_ir(context, buffer, ctypes.byref(module), ctypes.byref(message)):
            api.context_dispose(context)
            raise NativeError(f"LLVM JIT of {self.name} failed: invalid LLVM IR: {api.message(message.value)}")
        return module.value

    def lookup(self, symbol: str) -> int:
        """The address of ``symbol`` (the first lookup compiles the module)."""
        address = ctypes.c_uint64()
        self._api.check(self._api.lookup(self._jit, ctypes.byref(address), symbol.encode()), self.name,
                        self._reported)
        return address.value

    def __del__(self) -> None:
        if getattr(self, "_jit", None):
            error = self._api.dispose_jit(self._jit)
            if error:  # (consumed: nothing to tell at exit)
                self._api.error_text(error)
