"""Flush subnormals to zero inside compiled steps (x86: the MXCSR FTZ and DAZ bits).

A step sets FTZ (results that would be subnormal become 0) and DAZ (subnormal inputs read
as 0) on entry and restores the caller's MXCSR on exit, as oneDNN and XLA run their
kernels: subnormal weights or activations would otherwise make every FMA that touches
them take a microcode assist, tens of times slower. MXCSR is per thread, so every task
body run on the thread pool (an ``scf.forall`` body) sets and restores it as well.
On other architectures nothing is inserted.
"""

from __future__ import annotations

import platform

from mlir import ir
from mlir.dialects import arith, llvm, memref

from mlir_nn.codegen.walk import collect_ops

FTZ_DAZ = 0x8040  # MXCSR bit 15 (flush to zero) | bit 6 (denormals are zero)


def supported() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _mxcsr_slot() -> ir.Value:
    """A 4-byte stack slot (inside an alloca scope, so loops do not grow the stack)."""
    i32 = ir.IntegerType.get_signless(32)
    return llvm.alloca(llvm.PointerType.get(), arith.constant(i32, 1), i32)


def _intrinsic(name: str, slot: ir.Value) -> None:
    llvm.CallIntrinsicOp(None, name, [slot], [], [])


def _set_flush(point: ir.InsertionPoint) -> ir.Value:
    """At ``point``: save MXCSR, set FTZ|DAZ; the saved value."""
    i32 = ir.IntegerType.get_signless(32)
    with point:
        scope = memref.AllocaScopeOp([i32])
        body = scope.bodyRegion.blocks.append()
        with ir.InsertionPoint(body):
            slot = _mxcsr_slot()
            _intrinsic("llvm.x86.sse.stmxcsr", slot)
            saved = llvm.load(i32, slot)
            llvm.store(llvm.or_(saved, arith.constant(i32, FTZ_DAZ)), slot)
            _intrinsic("llvm.x86.sse.ldmxcsr", slot)
            memref.AllocaScopeReturnOp([saved])
    return scope.results[0]


def _restore(point: ir.InsertionPoint, saved: ir.Value) -> None:
    with point:
        scope = memref.AllocaScopeOp([])
        body = scope.bodyRegion.blocks.append()
        with ir.InsertionPoint(body):
            slot = _mxcsr_slot()
            llvm.store(saved, slot)
            _intrinsic("llvm.x86.sse.ldmxcsr", slot)
            memref.AllocaScopeReturnOp([])


def _bracket(block: ir.Block) -> None:
    """Set FTZ|DAZ at the start of ``block`` and restore before its terminator."""
    operations = list(block.operations)
    first = operations[0]
    with first.location:
        saved = _set_flush(ir.InsertionPoint(first))
        _restore(ir.InsertionPoint(operations[-1]), saved)


def flush_subnormals(module: ir.Module, name: str) -> None:
    """Bracket the public function ``name`` and every scf.forall body of ``module``."""
    if not supported():
        return
    def bracketed(op: ir.Operation) -> bool:
        return op.name == "scf.forall" or (
            op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name)

    with module.context:
        for op in collect_ops(module, bracketed):
            _bracket(op.regions[0].blocks[0])
