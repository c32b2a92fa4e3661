"""Sums of placed slices written as one tensor: the gradient of a split, a concatenation.

``slice_grad`` places its input at a box of zeros; the gradient of ``x.split(...)`` (and
``cat``) is a sum of such placements over disjoint boxes. Added element by element, each
placement was a zero fill, a copy of it (the fill had several users) with the piece inserted,
and an add of all the full-size tensors: in GPT's attention, the gradient of the fused
q, k, v projection moved eight times its own size through memory. Here an ``add`` of two
placements (or of sums of them) whose boxes are disjoint inserts the pieces of one into the
other; once the pieces cover the whole tensor, all of them go into an empty tensor (no fill).
Each sum is exact: the other side is zero where a piece lands (only -0.0 stays -0.0, where
the add gave +0.0). Pieces that are reshapes of static tensors (attention's merged heads: a
transpose, collapsed) are inserted before the reshape, into the joined tensor reshaped alike,
so that their producer writes into it in place (``_unfolded``).

Only where ``place`` makes an insert_slice (``b.strided_copies``: the CPU; the CUDA runtime
has no subviews) and every step is 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import tensor

from mlir_nn.codegen.builder import FunctionBuilder, Operand
from mlir_nn.ir import BATCH, Node
from mlir_nn.ir.shapes import Shape, numel

JOINED = "mlirnn.joined"  # on the empty tensor of a join: a number of its own


@dataclass(frozen=True)
class Piece:
    """A tensor placed at ``start`` of a larger one (its box: ``start`` to ``start + shape``)."""

    source: ir.Value
    start: tuple[int, ...]
    shape: Shape

    def apart(self, other: Piece) -> bool:
        """Whether the two boxes share no element (a run-time batch axis counts as shared)."""
        return any(a != BATCH and b != BATCH and (s + int(a) <= t or t + int(b) <= s)
                   for s, a, t, b in zip(self.start, self.shape, other.start, other.shape))


def note_piece(b: FunctionBuilder, node: Node, source: ir.Value) -> None:
    """Remember that ``node`` (a slice_grad lowered as an insert_slice) is ``source`` placed in zeros."""
    if b.strided_copies and all(int(s) == 1 for s in node.attr("step")):
        b.pieces[node] = (Piece(source, tuple(int(s) for s in node.attr("start")), node.inputs[0].shape),)


def joined(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value | None:
    """``add`` of two sums of placed pieces over disjoint boxes as insertions, or None."""
    left, right = node.inputs
    if left.shape != node.shape or right.shape != node.shape:
        return None
    ours, theirs = b.pieces.get(left), b.pieces.get(right)
    if ours is None or theirs is None or not all(p.apart(q) for p in ours for q in theirs):
        return None
    pieces = ours + theirs
    if _covers(pieces, node.shape):
        value, extra = b.empty(node.shape), pieces
    elif len(ours) >= len(theirs):
        value, extra = xs[0], theirs
    else:
        value, extra = xs[1], ours
    value = _insert_all(b, extra, value)
    b.pieces[node] = pieces
    return value


def _covers(pieces: tuple[Piece, ...], shape: Shape) -> bool:
    """Whether disjoint ``pieces`` fill ``shape``: equal volumes (the batch counted once), a batch
    axis whole in each."""
    whole = all(p.shape[d] == BATCH for p in pieces for d, s in enumerate(shape) if s == BATCH)
    return whole and sum(numel(p.shape) for p in pieces) == numel(shape)


def _insert_all(b: FunctionBuilder, pieces: tuple[Piece, ...], into: ir.Value) -> ir.Value:
    """``pieces`` inserted into ``into``: when all are collapses alike (``_unfolded``), their
    sources into ``into`` expanded once (an empty one made expanded), collapsed back; else one by one."""
    layouts = [_unfolded(piece, into) for piece in pieces]
    first = layouts[0] if layouts else None
    if first is None or any(layout is None or layout[:2] != first[:2] for layout in layouts):
        for piece in pieces:
            into = _insert(b, piece, into)
        return into
    groups, sizes = first[0], first[1]
    outer = ir.RankedTensorType(into.type)
    if getattr(into.owner, "name", None) == "tensor.empty":
        value = tensor.empty(sizes, outer.element_type)
        # one of its own (CSE merges equal ops: the joined tensors of all of GPT's layers went
        # into one, and bufferization copied in the first piece of each but one)
        value.owner.attributes[JOINED] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), len(b.pieces))
    else:
        value = tensor.expand_shape(ir.RankedTensorType.get(sizes, outer.element_type), into, groups, [], sizes)
    for (_, _, source, starts) in layouts:
        shape = ir.RankedTensorType(source.type).shape
        value = tensor.insert_slice(source, value, [], [], [], starts, shape, [1] * len(sizes))
    return tensor.collapse_shape(outer, value, groups)


def _unfolded(piece: Piece, into: ir.Value) -> tuple[list[list[int]], list[int], ir.Value, list[int]] | None:
    """Where a piece that is a ``collapse_shape`` of a static tensor goes before its collapse: the
    collapse's groups, ``into``'s sizes expanded alike, the uncollapsed source and its start there,
    when its slice's start and size along each merged axis are whole multiples of the merged inner
    sizes. Its producer (attention's head merge, a transpose) then writes into the joined tensor in
    place; inserted collapsed, it wrote a buffer of its own that a strided copy moved over (GPT
    medium: three copies per layer, on one thread). None where the piece is no such collapse."""
    owner = piece.source.owner
    collapse = getattr(owner, "operation", owner)
    if not isinstance(collapse, ir.Operation) or collapse.name != "tensor.collapse_shape":
        return None
    source = collapse.operands[0]
    inner, outer = ir.RankedTensorType(source.type), ir.RankedTensorType(into.type)
    if not inner.has_static_shape or not outer.has_static_shape:
        return None
    groups = [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(group)]
              for group in ir.ArrayAttr(collapse.attributes["reassociation"])]
    sizes, starts = [], []
    for group, start, whole in zip(groups, piece.start, outer.shape):
        tail = [inner.shape[i] for i in group[1:]]
        step = math.prod(tail)
        if start % step or whole % step:
            return None
        sizes += [whole // step] + tail
        starts += [start // step] + [0] * len(tail)
    return groups, sizes, source, starts


def _insert(b: FunctionBuilder, piece: Piece, into: ir.Value) -> ir.Value:
    sizes = b.sizes(piece.shape)
    dynamic = [v for v in sizes if isinstance(v, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(v, ir.Value) else v for v in sizes]
    return tensor.insert_slice(piece.source, into, [], dynamic, [], list(piece.start), static, [1] * len(static))
