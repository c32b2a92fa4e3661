"""Whole-tensor reductions as one loop over the elements: a loss's sum over (batch, n) as a 1-D sum.

A ``linalg.generic`` that reduces tensors of one shape (each read at the loop indices) into a
scalar is a nest of loops: over rows, then over a row's few elements. LLVM fully unrolls the
short inner loop and vectorizes the row loop across rows with gathers: the MSE loss sum of a
16-16-10 MLP's step (a 62-line kernel) took 0.11 s of LLVM, more than a 16x16 product's
1000-line kernel, and came out as 13 KB of code. Collapsed to 1-D (the elements in the same
order: a row-major tensor's), it is one loop that the loop vectorizer turns into a vector sum.

This runs on tensors after ``linalg-fuse-elementwise-ops``, which folds a reshape feeding a
generic back into the generic's loops (emitted collapsed, the sum came out of it 2-D again).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import tensor

from mlir_nn.codegen.maps import identity_map
from mlir_nn.codegen.walk import collect_linalg_ops

_DYNAMIC = ir.ShapedType.get_dynamic_size()


def _whole_reduction(op: ir.Operation) -> bool:
    """A generic on tensors of rank 2 or more, all loops reductions, every input read at the loop
    indices, one 0-d output, no ``linalg.index`` in its body."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    kinds = [str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"])]
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    rank = len(kinds)
    if rank < 2 or not all("reduction" in k for k in kinds) or maps[-1].results:
        return False
    inputs = list(op.operands)[:len(maps) - 1]
    if not all(isinstance(x.type, ir.RankedTensorType) for x in op.operands):
        return False
    if any(m != identity_map(rank) for m in maps[:-1]) or not inputs:
        return False
    return not any(inner.name == "linalg.index" for inner in op.regions[0].blocks[0].operations)


def _flat(x: ir.Value) -> ir.Value:
    kind = ir.RankedTensorType(x.type)
    size = 1
    for d in kind.shape:
        size = _DYNAMIC if d == _DYNAMIC or size == _DYNAMIC else size * d
    return tensor.collapse_shape(ir.RankedTensorType.get([size], kind.element_type), x, [list(range(kind.rank))])


def flatten_whole_reductions(module: ir.Module) -> int:
    """Make every whole-tensor reduction of ``module`` (``_whole_reduction``) one over its inputs
    collapsed to 1-D; the count rewritten."""
    with module.context:
        found = collect_linalg_ops(module, _whole_reduction)
        for op in found:
            count = len(ir.ArrayAttr(op.attributes["indexing_maps"])) - 1
            with ir.InsertionPoint(op), op.location:
                for i in range(count):
                    op.operands[i] = _flat(op.operands[i])
            op.attributes["indexing_maps"] = ir.ArrayAttr.get(
                [ir.AffineMapAttr.get(identity_map(1))] * count + [ir.AffineMapAttr.get(ir.AffineMap.get(1, 0, []))])
            op.attributes["iterator_types"] = ir.ArrayAttr.get([ir.ArrayAttr(op.attributes["iterator_types"])[0]])
    return len(found)
