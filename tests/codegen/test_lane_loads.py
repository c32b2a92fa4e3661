"""Odd-width vector loads split into lanes become scalar loads (the register kernel's A rows)."""

from __future__ import annotations

import ctypes

import numpy as np
from mlir import ir
from mlir.execution_engine import ExecutionEngine
from mlir.passmanager import PassManager

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen.lane_loads import scalarize_lane_loads
from tests.codegen.zoo import matmul_zoo

# out[i] = sum over lanes l of v[l] * (l + 1) for v loaded at src + i, as vector<{lanes}xf32>
KERNEL = """
func.func @lanes(%src: memref<64xf32>, %out: memref<8xf32>) attributes {{llvm.emit_c_interface}} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %i = %c0 to %c8 step %c1 {{
    %v = vector.load %src[%i] : memref<64xf32>, vector<{lanes}xf32>
    %zero = arith.constant 0.0 : f32
    %sum = {extracts}
    memref.store %sum, %out[%i] : memref<8xf32>
  }}
  return
}}
"""


def _lowered(lanes: int, extra_use: bool = False) -> ir.Module:
    terms, last = [], "%zero"
    for lane in range(lanes):
        terms.append(f"%e{lane} = vector.extract %v[{lane}] : f32 from vector<{lanes}xf32>\n"
                     f"    %w{lane} = arith.constant {lane + 1}.0 : f32\n"
                     f"    %p{lane} = arith.mulf %e{lane}, %w{lane} : f32\n"
                     f"    %s{lane} = arith.addf {last}, %p{lane} : f32")
        last = f"%s{lane}"
    if extra_use:  # the whole vector is also stored: not only lanes
        terms.append(f"vector.store %v, %src[%c0] : memref<64xf32>, vector<{lanes}xf32>")
    body = "\n    ".join(terms) + f"\n    %sum_done = arith.addf {last}, %zero : f32"
    text = KERNEL.format(lanes=lanes, extracts="arith.addf %zero, %zero : f32\n    " + body)
    text = text.replace("memref.store %sum,", "memref.store %sum_done,")
    module = ir.Module.parse(text)
    PassManager.parse("builtin.module(convert-scf-to-cf,convert-vector-to-llvm,finalize-memref-to-llvm,"
                      "convert-arith-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,"
                      "reconcile-unrealized-casts)").run(module.operation)
    return module


def _run(module: ir.Module) -> np.ndarray:
    src = np.arange(64, dtype=np.float32) * 0.25
    out = np.zeros(8, np.float32)
    engine = ExecutionEngine(module, opt_level=2)
    descriptors = [(ctypes.c_int64 * 5)(a.ctypes.data, a.ctypes.data, 0, a.size, 1) for a in (src, out)]
    pointers = [ctypes.pointer(ctypes.c_void_p(ctypes.addressof(d))) for d in descriptors]
    engine.invoke("lanes", *pointers)
    return out


def _vector_loads(module: ir.Module, lanes: int) -> int:
    return str(module).count(f"-> vector<{lanes}xf32>")


def test_an_odd_width_load_used_only_by_lane_extracts_becomes_scalar_loads_with_the_same_result():
    with ir.Context():
        module = _lowered(6)
        want = _run(_lowered(6))
        assert _vector_loads(module, 6) == 1
        assert scalarize_lane_loads(module) == 1
        assert _vector_loads(module, 6) == 0 and str(module).count("-> f32") >= 6
        np.testing.assert_array_equal(_run(module), want)
        src = np.arange(64, dtype=np.float32) * 0.25
        expected = [sum(src[i + lane] * (lane + 1) for lane in range(6)) for i in range(8)]
        np.testing.assert_allclose(want, expected, rtol=1e-6)


def test_power_of_two_loads_and_loads_with_other_uses_are_left_alone():
    with ir.Context():
        for module in (_lowered(4), _lowered(8), _lowered(6, extra_use=True)):
            assert scalarize_lane_loads(module) == 0


def test_the_blocked_kernels_read_odd_width_vectors_only_to_copy_them():
    """Lane by lane, an odd-width load is a register shuffle per lane; the packing of the
    batch's rows in whole groups copies 6-float rows, which are stored as they are."""
    graph = matmul_zoo(257, 33, "float32")
    text = CpuBackend().compile(graph).stages["llvm"]
    odd = {f"vector<{w}xf32>" for w in (3, 5, 6, 7, 12)}
    read_by_lanes = []
    with ir.Context() as context:
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(text)

        def visit(op: ir.Operation) -> ir.WalkResult:
            if op.name == "llvm.load" and str(op.result.type) in odd:
                if any(use.owner.name != "llvm.store" for use in op.result.uses):
                    read_by_lanes.append(str(op))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
    assert not read_by_lanes
