"""Finding ops in a module: one walk that collects what a predicate keeps."""

from __future__ import annotations

from collections.abc import Callable

from mlir import ir


def collect_ops(module: ir.Module, keep: Callable[[ir.Operation], bool]) -> list[ir.Operation]:
    """Every op of ``module`` (nested ones included, in walk order) for which ``keep`` is true;
    collected first, so the caller may rewrite or erase them afterwards."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if keep(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def collect_linalg_ops(module: ir.Module, keep: Callable[[ir.Operation], bool]) -> list[ir.Operation]:
    """``collect_ops`` for a predicate that only keeps linalg's structured ops (generic, fill,
    matmul, ...): the walk does not enter their bodies (scalar ops and ``linalg.yield``, most of
    a module's ops), and finds the same ops in the same order (they hold no other)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if not op.name.startswith("linalg."):
            return ir.WalkResult.ADVANCE
        if keep(op):
            found.append(op)
        return ir.WalkResult.SKIP

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def in_tasks(op: ir.Operation) -> bool:
    """Whether ``op`` runs inside a task already (an ``scf.forall``, e.g. a batch loop's:
    batched_products)."""
    parent = op.parent
    while parent.name != "func.func":
        if parent.name == "scf.forall":
            return True
        parent = parent.parent
    return False


def symbol(op: ir.Operation) -> str:
    """The symbol name of ``op`` (a function, a gpu.module)."""
    return ir.StringAttr(op.attributes["sym_name"]).value
