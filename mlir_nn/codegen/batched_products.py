"""Batched products (``bmm``) as a loop over the batch of 2-D ``linalg.matmul`` ops.

The batch axes are merged into one (a view), an ``scf.for`` runs over it, and each iteration
multiplies one pair of matrices (rank-reducing slices, views) with ``linalg.matmul`` into a
slice of the result. The CPU backend then gives each product the schedule of a 2-D one
(``cpu_matmul``: packed register blocks for large ones, vectorized loop orders for small
ones); as one ``linalg.generic`` LLVM left it as scalar loops. An operand that is a transpose
of its last two axes is read untransposed, the product's indexing maps transposing it
(attention's ``q @ k^T`` and the gradients ``g @ b^T``, ``a^T @ g``). A 4-D operand that is a
chain of transposes of a (batch, time, heads, width) tensor (the heads split off a projection)
reads each matrix from that tensor as a strided slice, not from a transposed copy: GPT small's
step made 8 instead of 18 such copies. With threads (``FunctionBuilder.batch_tasks``) a static
batch loop is an ``scf.forall`` of up to BATCH_TASKS equal runs of matrices, one loop per task:
on one thread these products were about 9% of GPT's step, serial at any thread count. Without
strided views (``FunctionBuilder.strided_copies`` off: the CUDA path, whose kernels see no
subviews) a bmm is one batched ``linalg.generic`` instead, which the GPU schedules map onto threads.
The products of causal attention compute each matrix in blocks that skip what the causal softmax
hides (``causal_products``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, scf, tensor

from mlir_nn.codegen import causal_products
from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
from mlir_nn.ir import Node
from mlir_nn.ir.shapes import BATCH

BATCH_TASKS = 8  # tasks of a batch loop at most (CPU threads: FunctionBuilder.batch_tasks)


def _swaps_last(node: Node) -> bool:
    """``node`` is a transpose of its last two axes only."""
    if node.op != "transpose" or node.inputs[0].op == "const":
        return False
    rank = len(node.shape)
    return tuple(node.attr("perm")) == tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _merged(b: FunctionBuilder, x: ir.Value, shape: tuple) -> ir.Value:
    """``x`` of ``shape`` (..., r, c) viewed as (batch, r, c)."""
    rank = len(shape)
    if rank == 3:
        return x
    dynamic = any(isinstance(s, ir.Value) for s in b.sizes(shape[:-2]))
    count = ir.ShapedType.get_dynamic_size() if dynamic else math.prod(int(d) for d in shape[:-2])
    kind = ir.RankedTensorType.get([count, int(shape[-2]), int(shape[-1])], b.element)
    return tensor.collapse_shape(kind, x, [list(range(rank - 2)), [rank - 2], [rank - 1]])


def _matrix(b: FunctionBuilder, x: ir.Value, i: ir.Value, rows: int, cols: int) -> ir.Value:
    """Matrix ``i`` of a (batch, rows, cols) tensor (a rank-reducing slice)."""
    dynamic = ir.ShapedType.get_dynamic_size()
    kind = ir.RankedTensorType.get([rows, cols], b.element)
    return tensor.extract_slice(kind, x, [i], [], [], [dynamic, 0, 0], [1, rows, cols], [1, 1, 1])


def _batched_generic(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """Loops (batch.., m, k, n): a[.., m, k] * b[.., k, n] summed over k, as one linalg.generic."""
    rank = len(node.shape)
    lhs, rhs = (b.tensor_of(v, i.shape) for v, i in zip(xs, node.inputs))
    batch, m, k, n = list(range(rank - 2)), rank - 2, rank - 1, rank
    maps = [ir.AffineMap.get(rank + 1, 0, [ir.AffineDimExpr.get(d) for d in batch + [m, k]]),
            ir.AffineMap.get(rank + 1, 0, [ir.AffineDimExpr.get(d) for d in batch + [k, n]])]
    out_map = ir.AffineMap.get(rank + 1, 0, [ir.AffineDimExpr.get(d) for d in batch + [m, n]])
    iterators = [PARALLEL] * (rank - 1) + [REDUCTION, PARALLEL]
    return b.reduce(node.shape, [lhs, rhs], maps, out_map, iterators, arith.mulf)


def _through_transposes(b: FunctionBuilder, node: Node) -> tuple[ir.Value | None, Node, tuple[int, ...]]:
    """(source tensor, source node, perm) of a chain of transposes ending at ``node``: ``node`` is
    the source transposed by ``perm`` (output axis j is source axis perm[j]); (None, node,
    identity) when ``node`` is no transpose."""
    value, perm = None, tuple(range(len(node.shape)))
    while node.op == "transpose" and node.inputs[0].op != "const":
        step = tuple(node.attr("perm"))
        value, node, perm = b.source_of_transpose[node], node.inputs[0], tuple(step[p] for p in perm)
    return value, node, perm


def _heads_view(b: FunctionBuilder, node: Node) -> tuple[ir.Value, tuple[int, ...], bool] | None:
    """A 4-D operand (batch, heads, r, c) that transposes a static-sized source whose first
    axis stays first and whose last axis is one of the matrix axes (attention's heads split off
    a (batch, time, heads, width) tensor, and its matrix transposes): (source tensor, perm,
    whether the source's matrix is (c, r)), read per matrix without the transposed copy."""
    value, src, perm = _through_transposes(b, node)
    if value is None or len(perm) != 4 or perm[0] != 0 or 3 not in perm[2:] or BATCH in src.shape[1:]:
        return None
    return b.tensor_of(value, src.shape), perm, perm[2] > perm[3]


def _head_matrix(b: FunctionBuilder, source: ir.Value, perm: tuple[int, ...], i: ir.Value, heads: int) -> ir.Value:
    """Matrix ``i`` (= batch * heads + head) of a ``_heads_view``: a strided rank-reducing slice."""
    shape = ir.RankedTensorType(source.type).shape
    offsets: list[ir.Value | int] = [0] * 4
    offsets[perm[0]] = arith.divui(i, b.index(heads))
    offsets[perm[1]] = arith.remui(i, b.index(heads))
    sizes = [1 if axis in perm[:2] else shape[axis] for axis in range(4)]
    kind = ir.RankedTensorType.get([shape[axis] for axis in range(4) if axis not in perm[:2]],
                                   ir.RankedTensorType(source.type).element_type)
    dynamic = ir.ShapedType.get_dynamic_size()
    static = [dynamic if isinstance(o, ir.Value) else o for o in offsets]
    return tensor.extract_slice(kind, source, [o for o in offsets if isinstance(o, ir.Value)], [], [], static, sizes,
                                [1] * 4)


def batch_tasks(count: int) -> int:
    """Tasks for a batch loop of ``count`` matrices (a dynamic count: 1): the largest divisor of
    ``count`` up to BATCH_TASKS, so that each task runs the same number of products."""
    if ir.ShapedType.is_dynamic_size(count):
        return 1
    return max(t for t in range(1, min(BATCH_TASKS, count) + 1) if count % t == 0)


def _loop(b: FunctionBuilder, lo: ir.Value, hi: ir.Value, out: ir.Value,
          product: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """``out`` (matrices ``lo`` to ``hi`` of the batch, from 0) with each matrix the ``product`` of its index."""
    m, n = ir.RankedTensorType(out.type).shape[1:]
    loop = scf.ForOp(lo, hi, b.index(1), [out])
    with ir.InsertionPoint(loop.body):
        i = loop.induction_variable
        at = arith.subi(i, lo)
        dynamic = ir.ShapedType.get_dynamic_size()
        stored = tensor.insert_slice(product(i), loop.inner_iter_args[0], [at], [], [], [dynamic, 0, 0], [1, m, n],
                                     [1, 1, 1])
        scf.yield_([stored])
    return loop.results[0]


def _on_tasks(b: FunctionBuilder, out: ir.Value, tasks: int, product: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """The batch loop split into ``tasks`` equal runs of matrices, an ``scf.forall`` (threads): each
    task a loop of its own, so what the products' schedule allocates before their loop
    (``row_blocks``) is per task."""
    count, m, n = ir.RankedTensorType(out.type).shape
    chunk = count // tasks
    forall = scf.ForallOp([0], [tasks], [1], [out])
    with ir.InsertionPoint(forall.body):
        lo = arith.muli(forall.induction_variables[0], b.index(chunk))
        dynamic = ir.ShapedType.get_dynamic_size()
        kind = ir.RankedTensorType.get([chunk, m, n], b.element)
        part = tensor.extract_slice(kind, forall.inner_iter_args[0], [lo], [], [], [dynamic, 0, 0], [chunk, m, n],
                                    [1, 1, 1])
        done = _loop(b, lo, arith.addi(lo, b.index(chunk)), part, product)
        with ir.InsertionPoint(forall.terminator().block):
            tensor.parallel_insert_slice(done, forall.inner_iter_args[0], [lo], [], [], [dynamic, 0, 0],
                                         [chunk, m, n], [1, 1, 1])
    return forall.results[0]


def lower_bmm(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    """(..., m, k) @ (..., k, n): one ``linalg.matmul`` per batch element (one batched generic without
    strided views). A 4-D operand that transposes its source's axes (the heads split off a
    (batch, time, heads, width) tensor) reads its matrices from the source (``_heads_view``)."""
    if not b.strided_copies:
        return _batched_generic(b, node, xs)
    heads = int(node.shape[1]) if len(node.shape) == 4 and node.shape[1] != BATCH else 0
    operands: list[ir.Value] = []
    shapes: list[tuple[int, int] | None] = []
    flips: list[bool] = []
    views: list[tuple[ir.Value, tuple[int, ...], bool] | None] = []
    for value, src in zip(xs, node.inputs):
        view = _heads_view(b, src) if heads else None
        views.append(view)
        if view is not None:
            operands.append(view[0])
            flips.append(view[2])
            shapes.append(None)
            continue
        flipped = _swaps_last(src)
        if flipped:
            value, src = b.source_of_transpose[src], src.inputs[0]
        operands.append(_merged(b, b.tensor_of(value, src.shape), src.shape))
        shapes.append((int(src.shape[-2]), int(src.shape[-1])))
        flips.append(flipped)
    m, n = int(node.shape[-2]), int(node.shape[-1])
    out_shape = tuple(node.shape)
    merged_out = _merged(b, b.empty(out_shape), out_shape)

    blocks = causal_products.plan(node, b.readers, b.results)

    def product(i: ir.Value) -> ir.Value:
        a_i, b_i = (_matrix(b, v, i, *s) if view is None else _head_matrix(b, v, view[1], i, heads)
                    for v, s, view in zip(operands, shapes, views))
        if blocks is not None:
            return causal_products.blocked_product(b, a_i, b_i, (m, n), flips[0], flips[1], blocks)
        return b.matmul(a_i, b_i, (m, n), flips[0], flips[1])

    total = ir.RankedTensorType(merged_out.type).shape[0]
    tasks = batch_tasks(total) if b.batch_tasks else 1
    if tasks > 1:
        result = _on_tasks(b, merged_out, tasks, product)
    else:
        result = _loop(b, b.index(0), tensor.dim(merged_out, b.index(0)), merged_out, product)
    if len(out_shape) == 3:
        return result
    rank = len(out_shape)
    sizes = b.sizes(out_shape)
    static = [ir.ShapedType.get_dynamic_size() if isinstance(s, ir.Value) else s for s in sizes]
    kind = ir.RankedTensorType.get(static, b.element)
    dynamic_sizes = [s for s in sizes if isinstance(s, ir.Value)]
    return tensor.expand_shape(kind, result, [list(range(rank - 2)), [rank - 2], [rank - 1]], dynamic_sizes, static)
