"""CPU loop order for matrix products: rewrite each ``linalg.matmul`` as a ``linalg.generic``.

``convert-linalg-to-loops`` nests loops in iteration-dim order. linalg.matmul iterates
(m, n, k), so the innermost loop walks a column of B with a stride: slow and not
vectorizable. Here each product gets the order whose innermost loop runs over
contiguous memory: (m, k, n) when B is (k, n) (a row update, which LLVM vectorizes),
(m, n, k) when B is transposed or rows are short (a dot product, whose sum is marked
``reassoc`` so LLVM vectorizes the reduction).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg

from mlir_nn.codegen.maps import dims_map, matmul_maps

PARALLEL = linalg.IteratorType.parallel
REDUCTION = linalg.IteratorType.reduction
ROW_MIN = 64


def _operand_dims(amap: ir.AffineMap) -> list[int]:
    return [ir.AffineDimExpr(e).position for e in amap.results]


def _transposes(op: ir.Operation) -> tuple[bool, bool]:
    """(transpose_a, transpose_b) of a linalg.matmul from its indexing maps."""
    if "indexing_maps" not in op.attributes:
        return False, False
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    return _operand_dims(maps[0]) == [2, 0], _operand_dims(maps[1]) == [1, 2]


def _as_generic(op: ir.Operation) -> ir.Value:
    a, b, c = op.operands
    ta, tb = _transposes(op)
    # matmul_maps use dims (m, n, k) = (0, 1, 2); choose the loop order, then renumber.
    # Short rows (n < ROW_MIN) gain nothing from the row update: keep the dot-product order.
    n = ir.RankedTensorType(c.type).shape[1]
    row_update = not tb and (ir.ShapedType.is_dynamic_size(n) or n >= ROW_MIN)
    order = [0, 2, 1] if row_update else [0, 1, 2]
    position = {dim: i for i, dim in enumerate(order)}
    maps = [dims_map(3, [position[d] for d in _operand_dims(m)]) for m in matmul_maps(ta, tb)]
    iterators = [REDUCTION if d == 2 else PARALLEL for d in order]
    fastmath = ir.Attribute.parse("#arith.fastmath<reassoc,contract>")

    @linalg.generic([a, b], [c], maps, iterators)
    def product(x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
        return arith.addf(acc, arith.mulf(x, y, fastmath=fastmath), fastmath=fastmath)

    return product


def matmuls_to_loop_friendly_generics(module: ir.Module) -> int:
    """Rewrite every linalg.matmul in ``module``; returns how many were rewritten."""
    matmuls: list[ir.Operation] = []

    def collect(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.matmul":
            matmuls.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    with module.context:
        for op in matmuls:
            with ir.InsertionPoint(op), op.location:
                replacement = _as_generic(op)
            op.result.replace_all_uses_with(replacement)
            op.erase()
    return len(matmuls)
