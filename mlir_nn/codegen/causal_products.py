"""The matrices of causal attention's batched products in blocks that skip what the mask hides (CPU).

A causal softmax (``softmax(causal=True)``) and its gradient read their operands on and below the
diagonal only and give zeros above it, so of the six products of an attention head about 40% of
the work is known zeros or never read:

* a product read only through a causal softmax or its gradient (the scores ``q @ k^T``, the
  probabilities' gradient ``g @ v^T``, either through a scale): row block [r0, r1) of C needs
  its columns below r1 only, the rest is written zero;
* a left operand zero above the diagonal (``p @ v``, ``ds @ k``): row block [r0, r1) sums k < r1;
* a left operand zero below it (``p^T @ g``): row block [r0, r1) sums k >= r0;
* a right operand zero above it (``q^T @ ds``): column block [c0, c1) sums k >= c0.

A product read only below the diagonal is cut in column blocks (a transposed right operand, k^T or
v^T, is then copied once per matrix, as a whole product's, not once per row block). Each block is
a ``linalg.matmul`` of static slices, scheduled as any other matrix of a batch loop (``cpu_matmul``,
``row_blocks``); what no block computes is written zero, so every reader sees finite values. Only
on the CPU path (strided views); the batched generic of the CUDA path is left as it is. On one
core, a causal attention layer of GPT small's shapes (32x4 heads, 64x64, width 16) forward and
backward: 1.68 -> 1.42 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import tensor

from mlir_nn.codegen.builder import FunctionBuilder
from mlir_nn.ir import Node

BLOCK = 16  # rows (or columns) of C per block (8 or 32: slower on GPT small's attention, 64x64x16)
ABOVE, BELOW = "above", "below"  # where a matrix is known zero: strictly above or below its diagonal


def _causal(node: Node) -> bool:
    return node.op in ("softmax", "softmax_grad") and bool(node.attr("causal", False))


def _scale_of(node: Node) -> Node | None:
    """The tensor operand of a product with a finite scalar constant (a scale), else None."""
    if node.op != "mul":
        return None
    x, y = node.inputs
    for tensor_, constant in ((x, y), (y, x)):
        if constant.op == "const" and abs(float(constant.attr("value"))) < float("inf") and \
                tuple(tensor_.shape) == tuple(node.shape):
            return tensor_
    return None


def _swaps_last(node: Node) -> bool:
    rank = len(node.shape)
    return node.op == "transpose" and tuple(node.attr("perm")) == tuple(range(rank - 2)) + (rank - 1, rank - 2)


def zero_side(node: Node) -> str | None:
    """Where the matrices of ``node`` (its last two axes) are known zero: ABOVE or BELOW the
    diagonal (strictly), or None. A scale keeps the zeros (a finite constant), a transpose of the
    last two axes flips them."""
    if _causal(node):
        return ABOVE
    scaled = _scale_of(node)
    if scaled is not None:
        return zero_side(scaled)
    if _swaps_last(node):
        side = zero_side(node.inputs[0])
        return {ABOVE: BELOW, BELOW: ABOVE}.get(side) if side else None
    return None


def read_below_only(node: Node, readers: dict[Node, list[Node]], results: set[Node]) -> bool:
    """Every reader of ``node`` reads its matrices on and below the diagonal only: causal softmaxes
    and their gradients, through scales."""
    users = readers.get(node, [])
    if node in results or not users:
        return False
    return all(_causal(user) or (_scale_of(user) is node and read_below_only(user, readers, results))
               for user in users)


Span = tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """The products of C's blocks, each (rows, columns, k span), and its blocks of zeros (rows,
    columns): together all of C."""

    products: tuple[tuple[Span, Span, Span], ...]
    zeros: tuple[tuple[Span, Span], ...]


def _split(blocks: list[tuple[Span, Span, Span]]) -> Plan:
    """A Plan of ``blocks``, those with no k (all terms known zero) as zeros."""
    return Plan(tuple(x for x in blocks if x[2][1] > x[2][0] and x[0][1] > x[0][0]),
                tuple((r, c) for r, c, k in blocks if k[1] <= k[0] and r[1] > r[0]))


def plan(node: Node, readers: dict[Node, list[Node]], results: set[Node]) -> Plan | None:
    """The blocks of a bmm ``node`` with static matrices, or None where nothing is known zero."""
    a, b = node.inputs
    m, n, k = (a.shape[-2], b.shape[-1], a.shape[-1])
    if not all(isinstance(d, int) for d in (m, n, k)):
        return None
    rows, columns = ([(s, min(s + BLOCK, size)) for s in range(0, size, BLOCK)] for size in (m, n))
    side_a, side_b = zero_side(a), zero_side(b)
    if side_a == ABOVE and m > BLOCK:
        return _split([(r, (0, n), (0, min(r[1], k))) for r in rows])
    if side_a == BELOW and m > BLOCK:
        return _split([(r, (0, n), (r[0], k)) for r in rows])
    if side_b == ABOVE and n > BLOCK:
        return _split([((0, m), c, (c[0], k)) for c in columns])
    if side_b == BELOW and n > BLOCK:
        return _split([((0, m), c, (0, min(c[1], k))) for c in columns])
    if n > BLOCK and read_below_only(node, readers, results):
        return Plan(tuple(((min(c[0], m), m), c, (0, k)) for c in columns if c[0] < m),
                    tuple(((0, min(c[0], m)), c) for c in columns if c[0] > 0))
    return None


def _slice(value: ir.Value, offsets: tuple[int, int], sizes: tuple[int, int]) -> ir.Value:
    kind = ir.RankedTensorType.get(list(sizes), ir.RankedTensorType(value.type).element_type)
    return tensor.extract_slice(kind, value, [], [], [], list(offsets), list(sizes), [1, 1])


def _part(value: ir.Value, flipped: bool, rows: Span, columns: Span) -> ir.Value:
    """Rows and columns of the logical matrix of a stored one (``flipped``: stored transposed)."""
    if flipped:
        rows, columns = columns, rows
    return _slice(value, (rows[0], columns[0]), (rows[1] - rows[0], columns[1] - columns[0]))


def _put(part: ir.Value, into: ir.Value, rows: Span, columns: Span) -> ir.Value:
    return tensor.insert_slice(part, into, [], [], [], [rows[0], columns[0]],
                               [rows[1] - rows[0], columns[1] - columns[0]], [1, 1])


def blocked_product(b: FunctionBuilder, lhs: ir.Value, rhs: ir.Value, shape: tuple[int, int], ta: bool, tb: bool,
                    blocks: Plan) -> ir.Value:
    """op(lhs) @ op(rhs) of ``shape`` in the blocks of a ``plan``."""
    out = b.empty(shape)
    for rows, columns in blocks.zeros:
        out = _put(b.filled((rows[1] - rows[0], columns[1] - columns[0]), 0.0), out, rows, columns)
    for rows, columns, k in blocks.products:
        part = b.matmul(_part(lhs, ta, rows, k), _part(rhs, tb, k, columns),
                        (rows[1] - rows[0], columns[1] - columns[0]), ta, tb)
        out = _put(part, out, rows, columns)
    return out
