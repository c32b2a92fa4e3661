"""Sums over the batch of narrow (batch, n) tensors (bias gradients) with their totals in registers.

A ``linalg.generic`` that reduces a (batch, n) tensor over its rows into n totals (float64
totals of float32 values, ``accumulate``) became a loop over rows whose totals LLVM kept in
memory: the totals and the summed tensor are views of the same workspace, so it could not
promote them to registers, and each row's add waited on the previous row's store (a
load-add-store chain per row: the moons step's four bias gradients took a fifth of its
time at batch 10000). Tagged here (``ROW_SUM``), the CPU schedule (``passes/cpu_matmul.mlir``)
tiles such a sum by one row, vectorizes the row and hoists the totals out of the row loop:
n / lanes independent vector adds per row, in registers, in the same order as before (the
result is unchanged bit for bit).
"""

from __future__ import annotations

from mlir import ir

from mlir_nn.codegen.walk import collect_ops

ROW_SUM = "mlirnn.row_sum"
ROW_SUM_MAX = 64  # totals per sum (n) up to which they all stay in vector registers


def _is_row_sum(op: ir.Operation) -> bool:
    """A one-input generic reducing a (dynamic batch, static n <= ROW_SUM_MAX) tensor over dim 0
    into n totals (shaped (n,) or (1, n))."""
    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return False
    if [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])] != [
            "#linalg.iterator_type<reduction>", "#linalg.iterator_type<parallel>"]:
        return False
    rows, n = ir.RankedTensorType(op.operands[0].type).shape
    out = ir.RankedTensorType(op.results[0].type).shape
    return ir.ShapedType.is_dynamic_size(rows) and not ir.ShapedType.is_dynamic_size(n) and n <= ROW_SUM_MAX and (
        out in ([n], [1, n]))


def tag_row_sums(module: ir.Module) -> int:
    """Tag the module's sums over the batch for the schedule; how many."""
    found = collect_ops(module, _is_row_sum)
    with module.context:
        for op in found:
            op.attributes[ROW_SUM] = ir.UnitAttr.get()
    return len(found)
