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

from mlir_nn.codegen.walk import collect_ops

FTZ_DAZ = 0x8040  # MXCSR bit 15 (flush to zero) | bit 6 (denormals are zero)

# The two scopes, parsed: building them with the llvm dialect's Python module meant importing it
# (10-11 ms of a cold compile: ``codegen.dialects.llvm``). Each saves or loads MXCSR through a
# 4-byte stack slot inside an alloca scope, so loops do not grow the stack; %saved in _RESTORE
# stands for the value that _SET returns.
_SET = f"""%0 = memref.alloca_scope -> (i32) {{
  %one = arith.constant 1 : i32
  %slot = llvm.alloca %one x i32 : (i32) -> !llvm.ptr
  llvm.call_intrinsic "llvm.x86.sse.stmxcsr"(%slot) : (!llvm.ptr) -> ()
  %saved = llvm.load %slot : !llvm.ptr -> i32
  %bits = arith.constant {FTZ_DAZ} : i32
  %flushing = llvm.or %saved, %bits : i32
  llvm.store %flushing, %slot : i32, !llvm.ptr
  llvm.call_intrinsic "llvm.x86.sse.ldmxcsr"(%slot) : (!llvm.ptr) -> ()
  memref.alloca_scope.return %saved : i32
}}"""
_RESTORE = """memref.alloca_scope {
  %saved = arith.constant 0 : i32
  %one = arith.constant 1 : i32
  %slot = llvm.alloca %one x i32 : (i32) -> !llvm.ptr
  llvm.store %saved, %slot : i32, !llvm.ptr
  llvm.call_intrinsic "llvm.x86.sse.ldmxcsr"(%slot) : (!llvm.ptr) -> ()
  memref.alloca_scope.return
}"""


def supported() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _insert(text: str, point: ir.InsertionPoint, location: ir.Location) -> ir.Operation:
    """The op of ``text`` inserted at ``point``, it and its body at ``location`` (not the text's)."""
    op = ir.Operation.parse(text)

    def locate(inner: ir.Operation) -> ir.WalkResult:
        inner.location = location
        return ir.WalkResult.ADVANCE

    op.walk(locate)
    point.insert(op)
    return op


def _bracket(block: ir.Block) -> None:
    """Set FTZ|DAZ at the start of ``block`` (saving MXCSR) and restore it before its terminator."""
    operations = list(block.operations)
    location = operations[0].location
    saved = _insert(_SET, ir.InsertionPoint(operations[0]), location).results[0]
    restore = _insert(_RESTORE, ir.InsertionPoint(operations[-1]), location)
    stand_in = restore.regions[0].blocks[0].operations[0]
    stand_in.result.replace_all_uses_with(saved)
    stand_in.erase()


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
