"""Small queries and copies of ranked tensors and linalg ops, shared by the CPU product rewrites."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import dims_map, identity_map


def dim_sizes(value: ir.Value) -> list[int | ir.Value]:
    """The sizes of a ranked tensor: ints where static, ``tensor.dim`` values where dynamic."""
    kind = ir.RankedTensorType(value.type)
    return [tensor.dim(value, arith.constant(ir.IndexType.get(), i)) if kind.is_dynamic_dim(i) else d
            for i, d in enumerate(kind.shape)]


def transposed(value: ir.Value) -> ir.Value:
    """A 2-D tensor copied transposed into a fresh one."""
    rows, cols = dim_sizes(value)
    out = tensor.empty([cols, rows], ir.RankedTensorType(value.type).element_type)

    @linalg.generic([value], [out], [dims_map(2, [1, 0]), identity_map(2)], [linalg.IteratorType.parallel] * 2)
    def transpose(x: ir.Value, _out: ir.Value) -> ir.Value:
        return x

    return transpose


def indexing_maps(op: ir.Operation) -> list[ir.AffineMap]:
    """The indexing maps of a linalg op, inputs first, then its init."""
    return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]


def matmul_transposes(op: ir.Operation) -> tuple[bool, bool]:
    """(transpose_a, transpose_b) of a linalg.matmul (on tensors or memrefs) from its indexing
    maps (none: neither)."""
    if "indexing_maps" not in op.attributes:
        return False, False
    dims = [[ir.AffineDimExpr(e).position for e in m.results] for m in indexing_maps(op)[:2]]
    return dims[0] == [2, 0], dims[1] == [1, 2]


def updated_input(op: ir.Operation) -> int | None:
    """Position of the input of a one-result linalg op that its result is written back into
    (``W - lr * grad`` materialized into ``W``, read with the init's map), or None."""
    targets = {use.owner.operands[1] for use in op.results[0].uses
               if use.owner.name == "bufferization.materialize_in_destination"}
    maps = indexing_maps(op)
    return next((i for i, x in enumerate(op.operands[:len(op.operands) - 1])
                 if x in targets and maps[i] == maps[-1]), None)
