"""Matrix products with a short static k as one element-wise pass, fused into their epilogue.

C = op(A) @ op(B) with k <= SHORT_K (the input gradient of a 10-class output layer: k = 10)
has too little work per output for packing and register blocks to pay: a blocked product
stores the whole accumulator after a few rank-1 updates, and its epilogue reads it back
(measured: 512x10x1024 with its ReLU-grad mask at 0.55x OpenBLAS's bare product on one
core). Here it becomes a ``linalg.generic`` over (m, n) that reads op(A)[i, kk] and
op(B)[kk, j] for each kk (k unrolled in its body, summed pairwise) with no accumulator
buffer, and an element-wise consumer that reads the product with the identity map (bias
and ReLU, the ReLU-grad mask, the folded update) is merged into it: one pass that reads
op(B)'s rows (op(B) stored transposed is copied to (k, n) first: k rows, cheap), a scalar
of op(A) per row and the epilogue's operands, and writes the result.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import identity_map
from mlir_nn.codegen.shaped import dim_sizes, indexing_maps, transposed, updated_input

SHORT_K = 16  # static k up to which a large product is one element-wise pass
PARALLEL = linalg.IteratorType.parallel


def _at(n_dims: int, results: list[int | str]) -> ir.AffineMap:
    """An affine map whose results are dims (ints) or constants (str digits)."""
    exprs = [ir.AffineConstantExpr.get(int(r)) if isinstance(r, str) else ir.AffineDimExpr.get(r) for r in results]
    return ir.AffineMap.get(n_dims, 0, exprs)


def short_product(a: ir.Value, b: ir.Value, ta: bool, tb: bool, k: int) -> ir.Value:
    """op(A) @ op(B) with static ``k`` as a generic over (m, n), k unrolled in its body."""
    if tb:  # (n, k) -> (k, n): every op(B)[kk, :] a contiguous row
        b = transposed(b)
    element = ir.RankedTensorType(a.type).element_type
    m, n = dim_sizes(a)[1 if ta else 0], dim_sizes(b)[1]
    out = tensor.empty([m, n], element)
    a_maps = [_at(2, [str(kk), 0] if ta else [0, str(kk)]) for kk in range(k)]
    b_maps = [_at(2, [str(kk), 1]) for kk in range(k)]
    fastmath = ir.Attribute.parse("#arith.fastmath<contract>")

    @linalg.generic([a] * k + [b] * k, [out], a_maps + b_maps + [identity_map(2)], [PARALLEL] * 2)
    def product(*args: ir.Value) -> ir.Value:
        terms = [arith.mulf(x, y, fastmath=fastmath) for x, y in zip(args[:k], args[k:2 * k])]
        while len(terms) > 1:  # pairwise: a chain of k dependent FMAs would bound the pass by their latency
            pairs = [arith.addf(x, y, fastmath=fastmath) for x, y in zip(terms[::2], terms[1::2])]
            terms = pairs + terms[len(pairs) * 2:]
        return terms[0]

    return product


def _epilogue_of(product: ir.Value) -> tuple[ir.Operation, int] | None:
    """(consumer, input position) when every use of ``product`` is one all-parallel generic
    that reads it once with the identity map (and may also have it as its unread init)."""
    consumers = {use.owner for use in product.uses}
    if len(consumers) != 1:
        return None
    op = consumers.pop()
    if op.name != "linalg.generic" or len(op.results) != 1:
        return None
    if any("parallel" not in str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])):
        return None
    n_in = len(op.operands) - 1
    maps, body = indexing_maps(op), op.regions[0].blocks[0]
    reads = [i for i in range(n_in) if op.operands[i] == product]
    if len(reads) != 1 or maps[reads[0]] != identity_map(2) or maps[-1] != identity_map(2):
        return None
    if op.operands[n_in] == product and list(body.arguments[n_in].uses):
        return None
    return op, reads[0]


def _move_body(source: ir.Block, into: ir.InsertionPoint, skip_terminator: bool) -> ir.Value | None:
    """Move the ops of ``source`` to ``into``; the value its terminator yields when skipped."""
    ops = list(source.operations)
    last = ops.pop() if skip_terminator else None
    for op in ops:
        op.detach_from_parent()
        into.insert(op)
    return None if last is None else last.operands[0]


def fuse_into_epilogue(product: ir.Value) -> ir.Value:
    """The element-wise consumer of a ``short_product`` merged with it (one generic), or the
    product itself when it has no such consumer. An update's parameter stays its init."""
    found = _epilogue_of(product)
    if found is None:
        return product
    consumer, position = found
    producer = product.owner
    n_in = len(consumer.operands) - 1
    kept = [i for i in range(n_in) if i != position]
    init = consumer.operands[n_in]
    updated = updated_input(consumer)
    if updated is not None:
        init, kept = consumer.operands[updated], [i for i in kept if i != updated]
    elif init == product:
        init = producer.operands[-1]  # the product's own fresh tensor
    p_in = list(producer.operands[:-1])
    inputs = p_in + [consumer.operands[i] for i in kept]
    c_maps = indexing_maps(consumer)
    maps = indexing_maps(producer)[:-1] + [c_maps[i] for i in kept] + [c_maps[-1]]
    with ir.InsertionPoint(consumer), consumer.location:
        fused = linalg.GenericOp([consumer.results[0].type], inputs, [init], ir.ArrayAttr.get(
            [ir.AffineMapAttr.get(m) for m in maps]), consumer.attributes["iterator_types"])
    types = [ir.RankedTensorType(x.type).element_type for x in inputs + [init]]
    block = fused.regions[0].blocks.append(*types, arg_locs=[consumer.location] * len(types))
    p_body, c_body = producer.regions[0].blocks[0], consumer.regions[0].blocks[0]
    for old, new in zip(p_body.arguments[:len(p_in)], block.arguments[:len(p_in)]):
        old.replace_all_uses_with(new)
    at = ir.InsertionPoint(block)
    value = _move_body(p_body, at, skip_terminator=True)
    c_body.arguments[position].replace_all_uses_with(value)
    for i, new in zip(kept, block.arguments[len(p_in):len(p_in) + len(kept)]):
        c_body.arguments[i].replace_all_uses_with(new)
    out = block.arguments[len(inputs)]
    if updated is not None:
        c_body.arguments[updated].replace_all_uses_with(out)  # read through the init, as before
    c_body.arguments[n_in].replace_all_uses_with(out)
    _move_body(c_body, at, skip_terminator=False)
    consumer.results[0].replace_all_uses_with(fused.results[0])
    consumer.erase()
    producer.erase()
    return fused.results[0]
