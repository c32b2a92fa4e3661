"""MLIR's ExecutionEngine called through its C API (``engine_capi``): compiled code runs, and
what it cannot find is a NativeError naming it."""

from __future__ import annotations

import ctypes

import pytest
from mlir import ir

from mlir_nn.backends.engine_capi import Engine
from mlir_nn.backends.errors import NativeError

_TWICE = """
llvm.func @twice(%x: i64) -> i64 {
  %y = llvm.add %x, %x : i64
  llvm.return %y : i64
}
"""


def test_an_engine_compiles_a_module_whose_function_runs():
    with ir.Context():
        engine = Engine(ir.Module.parse(_TWICE), 2, "twice")
    twice = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(engine.lookup("twice"))
    assert [twice(n) for n in (0, 21, -5)] == [0, 42, -10]


def test_a_missing_symbol_is_named():
    with ir.Context():
        engine = Engine(ir.Module.parse(_TWICE), 0, "twice")
    with pytest.raises(NativeError, match="symbol thrice not found"):
        engine.lookup("thrice")
