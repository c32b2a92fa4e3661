"""LLVM's own JIT at -O0 code generation (``llvm_jit``): a module's always-inline functions
inlined, its calls resolved to this process's symbols, its code run; failures named."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest
from mlir import ir

from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.llvm_jit import Jit

# labs(x) from libc, through an internal always-inline helper
_ABSOLUTE_SUM = """
llvm.func @labs(i64) -> i64
llvm.func internal @helper(%x: i64) -> i64 attributes {always_inline} {
  %y = llvm.call @labs(%x) : (i64) -> i64
  llvm.return %y : i64
}
llvm.func @absolute_sum(%x: i64, %y: i64) -> i64 {
  %a = llvm.call @helper(%x) : (i64) -> i64
  %b = llvm.call @helper(%y) : (i64) -> i64
  %s = llvm.add %a, %b : i64
  llvm.return %s : i64
}
"""


def test_a_module_compiles_calls_the_process_and_runs():
    with ir.Context():
        jit = Jit(ir.Module.parse(_ABSOLUTE_SUM), "absolute_sum")
    function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(jit.lookup("absolute_sum"))
    assert function(-3, 4) == 7 and function(-10, -20) == 30


def test_the_helper_is_inlined():
    """``helper`` is internal and always-inline: nothing is left of it to look up."""
    with ir.Context():
        jit = Jit(ir.Module.parse(_ABSOLUTE_SUM), "absolute_sum")
    assert jit.lookup("absolute_sum")
    with pytest.raises(NativeError, match="LLVM JIT of absolute_sum failed.*helper"):
        jit.lookup("helper")


def test_a_function_that_is_nowhere_is_named_at_the_lookup():
    with ir.Context():
        jit = Jit(ir.Module.parse("llvm.func @nowhere_at_all() -> i64\n"
                                  "llvm.func @f() -> i64 {\n  %x = llvm.call @nowhere_at_all() : () -> i64\n"
                                  "  llvm.return %x : i64\n}"), "f")
    with pytest.raises(NativeError, match="nowhere_at_all"):
        jit.lookup("f")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_jit_uses_the_llvm_library_that_mlir_loaded():
    """One mapping of LLVM's library: the IR that MLIR translates and the JIT that compiles it
    share LLVM's state (a second copy would hold contexts and targets of its own)."""
    with ir.Context():
        Jit(ir.Module.parse("llvm.func @f() {\n  llvm.return\n}"), "f").lookup("f")
    maps = Path("/proc/self/maps").read_text().splitlines()
    assert sum("libLLVM.so" in line and line.split()[2] == "00000000" for line in maps) == 1
