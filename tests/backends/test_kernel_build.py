"""Building one chunk of a split step: its LLVM text, and ops the passes left unlowered named."""

from __future__ import annotations

import ctypes

import pytest
from mlir import ir

from mlir_nn.backends.kernel_build import Job, build
from mlir_nn.backends.kernel_split import Chunk
from mlir_nn.backends.lowering import LoweringError
from mlir_nn.support.pipelines import Pipeline

_LOWERED = "module {\n  llvm.func @k(%a: i64) -> i64 {\n    llvm.return %a : i64\n  }\n}\n"
_NOT_LOWERED = ("module {\n  llvm.func @k(%a: i64) -> i64 {\n    %b = arith.addi %a, %a : i64\n"
                "    llvm.return %b : i64\n  }\n}\n")


def test_a_chunk_compiles_to_an_object_and_returns_its_llvm_text(tmp_path):
    job = Job(Chunk(_LOWERED, ("k",), (), whole=True, kernels=("k",)), Pipeline("none", ()), tmp_path / "k.o")
    text = build(job)
    assert (tmp_path / "k.o").stat().st_size > 0
    with ir.Context():
        assert text == str(ir.Module.parse(text))  # the printed module, as str() prints it
    assert "llvm.func @k" in text


def test_ops_left_unlowered_are_named_when_llvm_cannot_take_them(tmp_path):
    job = Job(Chunk(_NOT_LOWERED, ("k",), (), whole=True, kernels=("k",)), Pipeline("none", ()), tmp_path / "k.o")
    with pytest.raises(LoweringError, match="none did not lower everything to the LLVM dialect; left: arith.addi"):
        build(job)


def _each_element(name: str, value: str, body: str) -> str:
    """An LLVM-dialect function ``@name(%p, %n, %<value>: f32)`` that runs ``body`` on each
    float ``%q = &p[i]``, i < n."""
    return f"""
llvm.func @{name}(%p: !llvm.ptr, %n: i64, %{value}: f32) {{
  %zero = llvm.mlir.constant(0 : i64) : i64
  %one = llvm.mlir.constant(1 : i64) : i64
  llvm.br ^loop(%zero : i64)
^loop(%i: i64):
  %done = llvm.icmp "sge" %i, %n : i64
  llvm.cond_br %done, ^end, ^body
^body:
  %q = llvm.getelementptr %p[%i] : (!llvm.ptr, i64) -> !llvm.ptr, f32
{body}
  %next = llvm.add %i, %one : i64
  llvm.br ^loop(%next : i64)
^end:
  llvm.return
}}
"""


# a step that calls two kernels, one of them (``scale``) compiled in another module
_FILL = _each_element("fill", "v", "  llvm.store %v, %q : f32, !llvm.ptr")
_STEP = "llvm.func @scale(!llvm.ptr, i64, f32)" + _FILL + """
llvm.func @step(%p: !llvm.ptr, %n: i64) {
  %three = llvm.mlir.constant(3.0 : f32) : f32
  %half = llvm.mlir.constant(0.5 : f32) : f32
  llvm.call @fill(%p, %n, %three) : (!llvm.ptr, i64, f32) -> ()
  llvm.call @scale(%p, %n, %half) : (!llvm.ptr, i64, f32) -> ()
  llvm.return
}
"""
_SCALE = _each_element("scale", "s", "  %x = llvm.load %q : !llvm.ptr -> f32\n  %y = llvm.fmul %x, %s : f32\n"
                                      "  llvm.store %y, %q : f32, !llvm.ptr")


def test_a_step_calls_a_kernel_of_another_engine_through_its_slot():
    """``kernel_slots`` turns the declaration of ``scale`` into a call through a global that is
    null until filled; ``packed_interface`` adds the step's ``void **`` entry point. Compiled in
    LLVM's JIT at -O0 with ``scale`` in MLIR's engine, the filled step runs both kernels."""
    from mlir_nn.backends.engine_capi import Engine
    from mlir_nn.backends.kernel_build import kernel_slots, packed_interface
    from mlir_nn.backends.llvm_jit import Jit

    with ir.Context():
        step = ir.Module.parse(_STEP)
        slots = kernel_slots(step, ["scale"])
        entry = packed_interface(step, "step")
        assert slots == {"scale": "mlirnn_slot_scale"} and entry == "_mlir_step"
        jit, engine = Jit(step, "step"), Engine(ir.Module.parse(_SCALE), 2, "scale")
    ctypes.c_void_p.from_address(jit.lookup("mlirnn_slot_scale")).value = engine.lookup("scale")
    data = (ctypes.c_float * 7)()
    pointer, count = ctypes.c_void_p(ctypes.addressof(data)), ctypes.c_int64(len(data))
    arguments = (ctypes.c_void_p * 2)(ctypes.addressof(pointer), ctypes.addressof(count))
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(jit.lookup(entry))(arguments)
    assert list(data) == [1.5] * 7


def test_a_kernel_taking_an_aggregate_cannot_have_a_slot():
    from mlir_nn.backends.errors import NativeError
    from mlir_nn.backends.kernel_build import kernel_slots

    with ir.Context():
        step = ir.Module.parse("llvm.func @k(!llvm.struct<(ptr, i64)>)")
        with pytest.raises(NativeError, match="function k has the type"):
            kernel_slots(step, ["k"])
