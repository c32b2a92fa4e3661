"""Reductions over the batch in parallel: two kernels, deterministic, for any batch size.

A sum of many elements into a few outputs (the loss: ``mse``, ``sum``/``mean`` over
every axis; a bias gradient ``sum_to`` (N, n) -> (n,) with small n) is a
``linalg.generic`` whose body is ``out + f(ins)``. Left to the generic schedule it runs
in one thread per output element, serially over the batch. After bufferization,
``split_reductions`` replaces each such op with loops in the form the rest of the
pipeline maps to the GPU (``scf.parallel`` block loops holding ``scf.forall`` thread
loops, a shared-memory buffer in the workgroup address space):

* kernel 1, grid (G, Q) of ``THREADS`` threads, G = clamp(ceil(R / (THREADS *
  ITEMS)), 1, MAX_BLOCKS) computed on the host from the reduced size R (which holds the
  batch): each thread sums elements ``p, p + G*THREADS, ...`` of output ``q``'s reduction
  domain (neighbouring threads on neighbouring elements), the block adds its threads'
  sums with a shared-memory tree and writes one partial per block to a scratch buffer
  (Q, G), or, when G == 1, the result itself;
* kernel 2, grid (Q, when G > 1, else 0: the plan then drops the launch), one block per
  output: its threads add the G partials, a tree again, and thread 0 writes the result.

Sums into more than ``MAX_OUTPUTS`` outputs (the 1024-wide bias gradients) take the wide
form, ``split_wide``: a thread per output and blocks over chunks of the batch.

The zero fill of the output before the reduction is folded in (the result is written as
``init + total``), so a reduction costs one kernel at small batches, two at large ones.
The summation order depends only on the shapes: the same inputs give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlir.dialects import arith, memref, scf
from mlir.ir import (
    AffineConstantExpr,
    AffineDimExpr,
    AffineMapAttr,
    ArrayAttr,
    Attribute,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    MemRefType,
    Operation,
    Value,
)

from mlir_nn.gpu.schedule import NODE, REDUCE, THREADS_1D, clone_body, iterator_kinds

THREADS = THREADS_1D  # per block, a power of two (the tree halves it)
ITEMS = 4  # elements per thread before another block is added
MAX_BLOCKS = 1024  # blocks of kernel 1 per output (about what an H100/H200 keeps resident)
MAX_OUTPUTS = 32  # more outputs than a warp: the wide form (``split_wide``), a thread per output
ROWS = 16  # wide form: reduced elements per thread before another block row is added


@dataclass(frozen=True)
class Reduction:
    """What ``split_reductions`` needs to know about a splittable reduction."""

    op: Operation
    inputs: list[Value]
    output: Value
    maps: list[list[tuple[str, int]]]  # per input: ("dim", position) or ("const", value) per index
    out_dims: list[int]  # the loop dims indexing the output, in order
    reduced: list[int]  # reduction loop dims


def _map_results(attr: Attribute) -> list[tuple[str, int]] | None:
    out: list[tuple[str, int]] = []
    for expr in AffineMapAttr(attr).value.results:
        expr = expr.maybe_downcast()
        if isinstance(expr, AffineDimExpr):
            out.append(("dim", expr.position))
        elif isinstance(expr, AffineConstantExpr):
            out.append(("const", expr.value))
        else:
            return None
    return out


def _sum_body(op: Operation) -> bool:
    """The body is ``out + f(ins)``: ``out`` used once, by the yielded addf, no regions or linalg.index."""
    block = op.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    out = block.arguments[len(block.arguments) - 1]
    if len(ops[-1].operands) != 1:
        return False
    combine = getattr(ops[-1].operands[0].owner, "operation", None)
    if combine is None or combine.name != "arith.addf":
        return False
    return (out in list(combine.operands) and len(list(out.uses)) == 1
            and all(not o.regions and o.name != "linalg.index" for o in ops[:-1]))


def analyse(op: Operation) -> Reduction | None:
    """A ``Reduction`` if ``op`` (a bufferized linalg.generic) is worth splitting, else None."""
    if op.name != "linalg.generic" or len(op.results) or "reduction" not in iterator_kinds(op):
        return None
    n_in, n_out = list(op.attributes["operandSegmentSizes"])
    maps = [_map_results(a) for a in ArrayAttr(op.attributes["indexing_maps"])]
    if n_out != 1 or any(m is None for m in maps) or not _sum_body(op):
        return None
    output = op.operands[n_in]
    out_type = MemRefType(output.type)
    if str(out_type.element_type) not in ("f32", "f64") or not out_type.has_static_shape:
        return None
    kinds = iterator_kinds(op)
    parallel = [d for d, k in enumerate(kinds) if k == "parallel"]
    reduced = [d for d, k in enumerate(kinds) if k == "reduction"]
    out_dims = [v for kind, v in maps[n_in] if kind == "dim"]
    sized = {d for v, m in zip(op.operands, maps) if isinstance(v.type, MemRefType) for kind, d in m if kind == "dim"}
    if sorted(out_dims) != parallel or len(out_dims) != out_type.rank or len(sized) != len(kinds):
        return None
    return Reduction(op, list(op.operands)[:n_in], output, maps[:n_in], out_dims, reduced)


def _index(v: int) -> Value:
    return arith.constant(IndexType.get(), v)


def _loop_sizes(r: Reduction) -> dict[int, Value]:
    """Host values of each loop's trip count, from the operand dimension it indexes."""
    sizes: dict[int, Value] = {}
    for operand, results in [(r.output, [("dim", d) for d in r.out_dims]), *zip(r.inputs, r.maps)]:
        if not isinstance(operand.type, MemRefType):
            continue
        mt = MemRefType(operand.type)
        for axis, (kind, d) in enumerate(results):
            if kind == "dim" and d not in sizes:
                sizes[d] = _index(mt.shape[axis]) if not mt.is_dynamic_dim(axis) else memref.dim(operand, _index(axis))
    return sizes


def _delinearize(flat: Value, dims: list[int], sizes: dict[int, Value]) -> dict[int, Value]:
    """Row-major indices of ``flat`` over loop dims ``dims`` (the last one fastest)."""
    ivs: dict[int, Value] = {}
    for d in reversed(dims):
        ivs[d] = arith.remui(flat, sizes[d])
        flat = arith.divui(flat, sizes[d])
    return ivs


def _top_level(op: Operation) -> Operation:
    """The op of the function body that holds ``op``."""
    while op.parent is not None and op.parent.name != "func.func":
        op = op.parent.operation
    return op


def _fill_before(func_ops: list[Operation], r: Reduction) -> tuple[Operation, Value] | None:
    """The generalized ``linalg.fill`` of the output before ``r.op``, if nothing else touches it before; its value."""
    at = func_ops.index(r.op)
    before = [u for u in (_top_level(use.owner.operation) for use in r.output.uses) if u in func_ops[:at]]
    if len(before) != 1 or before[0].name != "linalg.generic":
        return None
    fill = before[0]
    block = fill.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if (len(fill.operands) != 2 or fill.operands[1] != r.output or isinstance(fill.operands[0].type, MemRefType)
            or len(body) != 1 or body[0].operands[0] != block.arguments[0] or "reduction" in iterator_kinds(fill)):
        return None
    return fill, fill.operands[0]


def _block_loop(uppers: list[Value], stage: int, of: Operation) -> tuple[scf.ParallelOp, list[Value], Operation]:
    """An ``scf.parallel`` over the grid for reduction ``of``; returns it, its indices and its terminator."""
    zero, one = _index(0), _index(1)
    loop = scf.ParallelOp([], [zero] * len(uppers), uppers, [one] * len(uppers), [])
    loop.operation.attributes[REDUCE] = IntegerAttr.get(IntegerType.get_signless(64), stage)
    if NODE in of.attributes:
        loop.operation.attributes[NODE] = of.attributes[NODE]
    body = loop.regions[0].blocks.append(*[IndexType.get()] * len(uppers))
    with InsertionPoint(body):
        end = scf.ReduceOp([], 0)
    return loop, list(body.arguments), end.operation


def _thread_loop(count: int) -> tuple[Value, InsertionPoint]:
    """An ``scf.forall`` of ``count`` iterations mapped to ``thread<x>``; its index and body."""
    loop = scf.ForallOp([0], [count], [1], mapping=ArrayAttr.get([Attribute.parse("#gpu.thread<x>")]))
    with InsertionPoint(loop.body):
        scf.InParallelOp()
    return loop.body.arguments[0], InsertionPoint.at_block_terminator(loop.body)


def _block_sum(shared: Value, write_total) -> None:
    """Tree-add ``shared[0:THREADS]``; thread 0 calls ``write_total(sum)``."""
    half = THREADS // 2
    while half > 1:
        t, ip = _thread_loop(half)
        with ip:
            other = arith.addi(t, _index(half))
            memref.store(arith.addf(memref.load(shared, [t]), memref.load(shared, [other])), shared, [t])
        half //= 2
    _, ip = _thread_loop(1)
    with ip:
        write_total(arith.addf(memref.load(shared, [_index(0)]), memref.load(shared, [_index(1)])))


def _shared(elem) -> Value:
    space = Attribute.parse("#gpu.address_space<workgroup>")
    return memref.alloc(MemRefType.get([THREADS], elem, memory_space=space), [], [])


def _result_or_partial(grid: Value, write: Callable[[], None], total: Value, partials: Value,
                       at: list[Value]) -> None:
    """With one block along the reduced dim (``grid == 1``) ``write`` the result; else store
    ``total`` into ``partials[at]`` for the second kernel to add up."""
    branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, grid, _index(1)), has_else=True)
    with InsertionPoint(branch.then_block):
        write()
        scf.YieldOp([])
    with InsertionPoint(branch.else_block):
        memref.store(total, partials, at)
        scf.YieldOp([])


def _accumulate(start: Value, stop: Value, step: Value, elem, add) -> Value:
    """``sum(add(i) for i in range(start, stop, step))`` in one thread, from zero."""
    loop = scf.ForOp(start, stop, step, [arith.constant(elem, 0.0)])
    with InsertionPoint(loop.body):
        scf.YieldOp([add(loop.induction_variable, loop.inner_iter_args[0])])
    return loop.results[0]


def _apply_body(r: Reduction, ivs: dict[int, Value], acc: Value) -> Value:
    """Clone ``r.op``'s body at the insertion point with its inputs loaded at ``ivs`` and ``out`` = ``acc``."""
    block = r.op.regions[0].blocks[0]
    args = list(block.arguments)
    mapping: dict[Value, Value] = {args[-1]: acc}
    for arg, operand, results in zip(args, r.inputs, r.maps):
        if isinstance(operand.type, MemRefType):
            idx = [ivs[v] if kind == "dim" else _index(v) for kind, v in results]
            mapping[arg] = memref.load(operand, idx)
        else:
            mapping[arg] = operand
    return clone_body(block, mapping)


def split(r: Reduction, func_ops: list[Operation]) -> None:
    """Replace ``r.op`` by the two kernels of the module docstring (host sizes and scratch before them)."""
    out_type = MemRefType(r.output.type)
    elem = out_type.element_type
    fill = _fill_before(func_ops, r)
    with InsertionPoint(r.op), Location.unknown():
        sizes = _loop_sizes(r)
        reduced = _index(1)
        for d in r.reduced:
            reduced = arith.muli(reduced, sizes[d])
        outputs = _index(_count(out_type.shape))
        grid = arith.ceildivui(reduced, _index(THREADS * ITEMS))
        grid = arith.maxui(arith.minui(grid, _index(MAX_BLOCKS)), _index(1))
        stride = arith.muli(grid, _index(THREADS))
        partials = memref.alloc(MemRefType.get([_count(out_type.shape), MemRefType.get_dynamic_size()], elem),
                                [grid], [])

        def write_result(q: Value, total: Value) -> None:
            ivs = _delinearize(q, r.out_dims, sizes)
            idx = [ivs[d] for d in r.out_dims]
            init = fill[1] if fill else memref.load(r.output, idx)
            memref.store(arith.addf(init, total), r.output, idx)

        # kernel 1: per-thread strided sums, a tree per block, one partial per block
        loop, (b, q), end = _block_loop([grid, outputs], 1, r.op)
        with InsertionPoint(end):
            shared = _shared(elem)
            t, ip = _thread_loop(THREADS)
            with ip:
                first = arith.addi(arith.muli(b, _index(THREADS)), t)
                out_ivs = _delinearize(q, r.out_dims, sizes)
                total = _accumulate(first, reduced, stride, elem, lambda i, acc: _apply_body(
                    r, {**out_ivs, **_delinearize(i, r.reduced, sizes)}, acc))
                memref.store(total, shared, [t])

            _block_sum(shared, lambda total: _result_or_partial(grid, lambda: write_result(q, total),
                                                                total, partials, [q, b]))
            memref.dealloc(shared)
        # kernel 2 (only when G > 1): one block per output adds its G partials
        # Q blocks if G > 1, else none (min(G - 1, 1) * Q: an i1 could not be a kernel argument after cse)
        blocks2 = arith.muli(arith.minui(arith.subi(grid, _index(1)), _index(1)), outputs)
        loop, (q,), end = _block_loop([blocks2], 2, r.op)
        with InsertionPoint(end):
            shared = _shared(elem)
            t, ip = _thread_loop(THREADS)
            with ip:
                total = _accumulate(t, grid, _index(THREADS), elem,
                                    lambda k, acc: arith.addf(acc, memref.load(partials, [q, k])))
                memref.store(total, shared, [t])
            _block_sum(shared, lambda total: write_result(q, total))
            memref.dealloc(shared)
        memref.dealloc(partials)
    r.op.erase()
    if fill:
        fill[0].erase()


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def split_wide(r: Reduction, func_ops: list[Operation]) -> None:
    """Replace ``r.op`` (more than ``MAX_OUTPUTS`` outputs) by two kernels with one thread per output.

    Kernel 1, grid (G, ceil(Q / THREADS)): thread t of block (g, c) sums chunk g of the
    reduction domain of output q = c * THREADS + t (neighbouring threads on neighbouring
    outputs, so a bias gradient's rows are read coalesced) into ``partials[g, q]``, or,
    when G == 1, writes the result. Kernel 2 (only when G > 1): each output's thread adds
    its G partials. G = clamp(ceil(R / ROWS), 1, MAX_BLOCKS).
    """
    out_type = MemRefType(r.output.type)
    elem = out_type.element_type
    count = _count(out_type.shape)
    fill = _fill_before(func_ops, r)
    with InsertionPoint(r.op), Location.unknown():
        sizes = _loop_sizes(r)
        reduced = _index(1)
        for d in r.reduced:
            reduced = arith.muli(reduced, sizes[d])
        grid = arith.maxui(arith.minui(arith.ceildivui(reduced, _index(ROWS)), _index(MAX_BLOCKS)), _index(1))
        chunk = arith.ceildivui(reduced, grid)
        columns = _index(-(-count // THREADS))
        partials = memref.alloc(MemRefType.get([MemRefType.get_dynamic_size(), count], elem), [grid], [])

        def per_output(c: Value, body) -> None:
            """In a thread loop: ``body(q)`` for output q = c * THREADS + t when q < count."""
            t, ip = _thread_loop(THREADS)
            with ip:
                q = arith.addi(arith.muli(c, _index(THREADS)), t)
                branch = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ult, q, _index(count)))
                with InsertionPoint(branch.then_block):
                    body(q)
                    scf.YieldOp([])

        def write_result(q: Value, total: Value) -> None:
            idx = [_delinearize(q, r.out_dims, sizes)[d] for d in r.out_dims]
            init = fill[1] if fill else memref.load(r.output, idx)
            memref.store(arith.addf(init, total), r.output, idx)

        loop, (g, c), end = _block_loop([grid, columns], 1, r.op)
        with InsertionPoint(end):
            def partial(q: Value) -> None:
                out_ivs = _delinearize(q, r.out_dims, sizes)
                start = arith.muli(g, chunk)
                stop = arith.minui(arith.addi(start, chunk), reduced)
                total = _accumulate(start, stop, _index(1), elem, lambda i, acc: _apply_body(
                    r, {**out_ivs, **_delinearize(i, r.reduced, sizes)}, acc))
                _result_or_partial(grid, lambda: write_result(q, total), total, partials, [g, q])

            per_output(c, partial)
        blocks2 = arith.muli(arith.minui(arith.subi(grid, _index(1)), _index(1)), columns)
        loop, (c,), end = _block_loop([blocks2], 2, r.op)
        with InsertionPoint(end):
            per_output(c, lambda q: write_result(q, _accumulate(
                _index(0), grid, _index(1), elem, lambda k, acc: arith.addf(acc, memref.load(partials, [k, q])))))
        memref.dealloc(partials)
    r.op.erase()
    if fill:
        fill[0].erase()


def split_reductions(func: Operation) -> int:
    """Split every splittable top-level reduction of ``func`` (see the module docstring)."""
    done = 0
    for op in [o.operation for o in func.regions[0].blocks[0].operations]:
        r = analyse(op)
        if r is not None:
            wide = _count(MemRefType(r.output.type).shape) > MAX_OUTPUTS
            (split_wide if wide else split)(r, [o.operation for o in func.regions[0].blocks[0].operations])
            done += 1
    return done

