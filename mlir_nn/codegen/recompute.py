"""Cheap element-wise maps recomputed by each element-wise user instead of stored (CPU, on tensors).

Elementwise fusion fuses a producer into each consumer and, when the producer has other users,
keeps its result as one more output of the fused op: a map as cheap as ``x * 0.5`` is then
written to memory in the forward pass and read back by the backward pass. GELU's forward wrote
four tensors (``x / sqrt 2``, ``1 + erf``, ``x / 2`` and the result) for its backward to read
three of them again. Here a generic that is one multiply, add, subtract or negation of one
tensor by constants, with several users, gets a copy of its own for each user that is a generic
(but one, when no other user needs it stored): each copy fuses into its user, which reads ``x``.
"""

from __future__ import annotations

from mlir import ir

from mlir_nn.codegen.walk import collect_linalg_ops

_CHEAP = frozenset({"arith.mulf", "arith.addf", "arith.subf", "arith.negf"})


def _cheap_map(op: ir.Operation) -> bool:
    """One generic of one result reading one tensor at the same index as it writes, whose body
    is one cheap arithmetic op of the input and constants."""
    if op.name != "linalg.generic" or len(op.results) != 1 or len(op.opview.inputs) != 1:
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    if any(not m.is_permutation or m != maps[-1] for m in maps):
        return False
    body = [inner for inner in op.regions[0].blocks[0].operations if inner.name != "arith.constant"]
    return (len(body) == 2 and body[0].name in _CHEAP and body[1].operands[0] == body[0].results[0]
            and all(isinstance(v, ir.BlockArgument) or _constant(v) for v in body[0].operands))


def _constant(value: ir.Value) -> bool:
    return isinstance(value.owner, ir.Operation | ir.OpView) and value.owner.name == "arith.constant"


def recompute_cheap_maps(module: ir.Module) -> int:
    """Give generic users of every cheap map with several users copies of their own (all of
    them when another user needs it stored, else all but one); how many copies."""
    copies = 0
    for op in collect_linalg_ops(module, _cheap_map):
        uses = [(use.owner, use.operand_number) for use in op.results[0].uses]
        fusing = [(user, i) for user, i in uses if user.name == "linalg.generic" and user.parent == op.parent]
        for user, position in fusing[1:] if len(fusing) == len(uses) else fusing:
            copy = op.clone(ir.InsertionPoint(user))
            user.operands[position] = copy.results[0]
            copies += 1
    return copies
