"""Sums of placed slices written as one tensor: the gradient of a split, a concatenation.

``slice_grad`` places its input at a box of zeros; the gradient of ``x.split(...)`` (and
``cat``) is a sum of such placements over disjoint boxes. Added element by element, each
placement was a zero fill, a copy of it (the fill had several users) with the piece inserted,
and an add of all the full-size tensors: in GPT's attention, the gradient of the fused
q, k, v projection moved eight times its own size through memory. Here an ``add`` of two
placements (or of sums of them) whose boxes are disjoint inserts the pieces of one into the
other; once the pieces cover the whole tensor, all of them go into an empty tensor (no fill).
Each sum is exact: the other side is zero where a piece lands (only -0.0 stays -0.0, where
the add gave +0.0).

Only where ``place`` makes an insert_slice (``b.strided_copies``: the CPU; the CUDA runtime
has no subviews) and every step is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import tensor

from mlir_nn.codegen.builder import FunctionBuilder, Operand
from mlir_nn.ir import BATCH, Node
from mlir_nn.ir.shapes import Shape, numel


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
    for piece in extra:
        value = _insert(b, piece, value)
    b.pieces[node] = pieces
    return value


def _covers(pieces: tuple[Piece, ...], shape: Shape) -> bool:
    """Whether disjoint ``pieces`` fill ``shape``: equal volumes (the batch counted once), a batch
    axis whole in each."""
    whole = all(p.shape[d] == BATCH for p in pieces for d, s in enumerate(shape) if s == BATCH)
    return whole and sum(numel(p.shape) for p in pieces) == numel(shape)


def _insert(b: FunctionBuilder, piece: Piece, into: ir.Value) -> ir.Value:
    sizes = b.sizes(piece.shape)
    dynamic = [v for v in sizes if isinstance(v, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(v, ir.Value) else v for v in sizes]
    return tensor.insert_slice(piece.source, into, [], dynamic, [], list(piece.start), static, [1] * len(static))
