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

from mlir_nn.codegen.batch_split import sum_over_batch
from mlir_nn.codegen.walk import collect_linalg_ops, in_tasks

ROW_SUM = "mlirnn.row_sum"
ROW_SUM_MAX = 64  # totals per sum (n) up to which they all stay in vector registers
# Elements of a sum over the batch from which a task of its own pays for its queueing and partial
# sum (one add an element; a product's TASK_WORK_MIN multiply-adds left the bias gradients of
# 24-48-48-24 at batch 20000 on one core, 4% of the step's time there)
SUM_TASK_ELEMENTS = 1 << 16
# Wider sums (more than ROW_SUM_MAX totals, up to WIDE_SUM_MAX) keep their loops (the totals in
# memory) but go into the same tasks of rows: the large step's two 1024-wide bias gradients at batch
# 512 ran on one thread, 44 us each alone.
WIDE_SUM_MAX = 1 << 14


def _is_row_sum(op: ir.Operation, n_max: int = ROW_SUM_MAX) -> bool:
    """A one-input generic reducing a (dynamic batch, static n <= ``n_max``) tensor over dim 0
    into n totals (shaped (n,) or (1, n))."""
    if op.name != "linalg.generic" or len(op.operands) != 2 or len(op.results) != 1:
        return False
    if [str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])] != [
            "#linalg.iterator_type<reduction>", "#linalg.iterator_type<parallel>"]:
        return False
    rows, n = ir.RankedTensorType(op.operands[0].type).shape
    out = ir.RankedTensorType(op.results[0].type).shape
    return ir.ShapedType.is_dynamic_size(rows) and not ir.ShapedType.is_dynamic_size(n) and n <= n_max and (
        out in ([n], [1, n]))


def tag_row_sums(module: ir.Module, threads: bool = False) -> int:
    """Tag the module's sums over the batch of at most ROW_SUM_MAX totals for the schedule; how
    many. With ``threads``, each sum of at most WIDE_SUM_MAX totals that adds its rows
    (``_adds_rows``; a max does not) and is not in a task already runs in tasks of at least
    SUM_TASK_ELEMENTS elements, their partial totals added at the end (``batch_split.sum_over_batch``)."""
    n_max = WIDE_SUM_MAX if threads else ROW_SUM_MAX
    sums = collect_linalg_ops(module, lambda op: _is_row_sum(op, n_max))
    tagged = [op for op in sums if ir.RankedTensorType(op.operands[0].type).shape[1] <= ROW_SUM_MAX]
    with module.context:
        for op in tagged:
            op.attributes[ROW_SUM] = ir.UnitAttr.get()
        for op in sums if threads else []:
            if _adds_rows(op) and not in_tasks(op):
                _in_row_tasks(op)
    return len(tagged)


def _adds_rows(op: ir.Operation) -> bool:
    """Whether ``op``'s body adds a value of its row's element to its total (a sum, not a max):
    its partial totals can then be added."""
    body = op.regions[0].blocks[0]
    total = body.operations[len(body.operations) - 1].operands[0].owner
    if isinstance(total, ir.Block) or total.name != "arith.addf":
        return False
    accumulated = body.arguments[1]
    return sum(operand == accumulated for operand in total.operands) == 1 and len(list(accumulated.uses)) == 1


def _in_row_tasks(op: ir.Operation) -> None:
    """``op`` as tasks over row ranges of its batch, each a copy of it into a partial sum."""
    x, c = op.operands
    n = ir.RankedTensorType(x.type).shape[1]

    def summed(rows: ir.Value, zeros: ir.Value) -> ir.Value:
        part = op.clone(ir.InsertionPoint.current)
        part.operands[0], part.operands[1] = rows, zeros
        return part.results[0]

    with ir.InsertionPoint(op), op.location:
        total = sum_over_batch([x], c, -(-SUM_TASK_ELEMENTS // n), summed)
    op.results[0].replace_all_uses_with(total)
    op.erase()
