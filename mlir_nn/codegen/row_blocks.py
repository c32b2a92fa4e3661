"""Small static products of a batch loop (attention's per-head 64x16x64) in register blocks of rows.

Each matrix of a batched product (``batched_products``: one ``linalg.matmul`` per iteration of
the batch loop) is small: packing its operands costs more than the product, and one output row
at a time, as a vector loop, either reloads B for every row (2 loads per FMA) or runs one chain
of dependent FMAs per row (bound by the FMA latency). Here C = op(A) @ op(B) is a loop over
blocks of ``rows`` rows of C, each block one ``linalg.generic`` over (row, k, column) tagged
ROW_BLOCK, which the schedule vectorizes whole: per k, one load of each vector of B[k, :] feeds
``rows`` broadcasts of A[i, k] and ``rows`` independent FMA chains, the block's accumulators in
registers. A stored (k, m) is read as it is (its block is a (k, rows) slice); B stored (n, k)
is copied to (k, n) once per matrix (in square vector tiles, shuffled in registers), into a
buffer allocated once before the batch loop.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, scf, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import dims_map, identity_map
from mlir_nn.codegen.shaped import dim_sizes

ROW_BLOCK = "mlirnn.row_block"  # the schedule vectorizes each tagged block in steps of K_STEP
ROW_BLOCK_ZERO = "mlirnn.row_block_zero"  # a block's zero start, vectorized: its accumulators start at zero
ROW_BLOCK_TRANSPOSE = "mlirnn.row_block_transpose"  # a copy the schedule runs in TRANSPOSE_TILE-square tiles
TRANSPOSE_TILE = 16  # cpu_matmul.TRANSPOSE_TILE
ROW_BLOCK_ACCUMULATORS = 24  # vector registers of a block's accumulators (of 32 with AVX-512)
ROW_BLOCK_MAX_ROWS = 8  # rows per block at most: its k loop is unrolled whole
ROW_BLOCK_MAX_K = 128
# The schedule's steps over k. Steps of 8 loaded 8 rows of B ahead (16 registers at 32 columns) beside
# the block's 16 accumulators: LLVM spilled them. GPT medium's attention products, one core: 14% less time.
K_STEP = 4
VECTOR_BITS = 512
PARALLEL, REDUCTION = linalg.IteratorType.parallel, linalg.IteratorType.reduction


def block_rows(m: int, n: int, k: int, bits: int) -> int | None:
    """Rows per register block of a static (m, n, k) product of ``bits``-bit elements: the largest
    divisor of m whose accumulators (vectors of n) fit ROW_BLOCK_ACCUMULATORS, at most
    ROW_BLOCK_MAX_ROWS; None when k is over ROW_BLOCK_MAX_K or no block of at least 2 rows fits."""
    vectors = -(-n * bits // VECTOR_BITS)
    if k > ROW_BLOCK_MAX_K or k % K_STEP or vectors > ROW_BLOCK_ACCUMULATORS // 2:
        return None
    fits = [r for r in range(2, ROW_BLOCK_MAX_ROWS + 1) if m % r == 0 and r * vectors <= ROW_BLOCK_ACCUMULATORS]
    return max(fits, default=None)


def _slice(value: ir.Value, offsets: list[int | ir.Value], sizes: list[int]) -> ir.Value:
    kind = ir.RankedTensorType.get(sizes, ir.RankedTensorType(value.type).element_type)
    dynamic = [o for o in offsets if isinstance(o, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(o, ir.Value) else o for o in offsets]
    return tensor.extract_slice(kind, value, dynamic, [], [], static, sizes, [1] * len(sizes))


def _put(part: ir.Value, into: ir.Value, offsets: list[int | ir.Value], sizes: list[int]) -> ir.Value:
    dynamic = [o for o in offsets if isinstance(o, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(o, ir.Value) else o for o in offsets]
    return tensor.insert_slice(part, into, dynamic, [], [], static, sizes, [1] * len(sizes))


def _transposed_into(value: ir.Value, out: ir.Value) -> ir.Value:
    """The 2-D ``value`` copied transposed into ``out``."""

    @linalg.generic([value], [out], [dims_map(2, [1, 0]), identity_map(2)], [PARALLEL] * 2)
    def transpose(x: ir.Value, _out: ir.Value) -> ir.Value:
        return x

    return transpose


def row_block_product(a: ir.Value, b: ir.Value, c: ir.Value, ta: bool, tb: bool, rows: int,
                      scratch: ir.InsertionPoint, zero: bool) -> ir.Value:
    """C + op(A) @ op(B) (static sizes) in blocks of ``rows`` rows of C; ``scratch``: where the
    buffer of a transposed B's (k, n) copy is created (before the batch loop). ``zero``: C is a
    zero fill, which each block does on its own rows instead (its accumulators then start at
    zero, not loaded from a filled buffer)."""
    m, n = dim_sizes(c)
    k = dim_sizes(a)[0 if ta else 1]
    element = ir.RankedTensorType(c.type).element_type
    if tb:
        with scratch:
            out = tensor.empty([k, n], element)
        b = _transposed_into(b, out)
        if k % TRANSPOSE_TILE == 0 and n % TRANSPOSE_TILE == 0:
            b.owner.attributes[ROW_BLOCK_TRANSPOSE] = ir.UnitAttr.get()
    index = ir.IndexType.get()
    if zero:
        c = c.owner.operands[1]  # the fill's destination
    loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, m), arith.constant(index, rows), [c])
    fastmath = ir.Attribute.parse("#arith.fastmath<contract>")
    with ir.InsertionPoint(loop.body):
        i = loop.induction_variable
        a_part = _slice(a, [0, i], [k, rows]) if ta else _slice(a, [i, 0], [rows, k])
        c_part = _slice(loop.inner_iter_args[0], [i, 0], [rows, n])
        if zero:
            c_part = linalg.fill(arith.constant(element, 0.0), outs=[c_part])
            c_part.owner.attributes[ROW_BLOCK_ZERO] = ir.UnitAttr.get()
        # dims (row, k, column)
        maps = [dims_map(3, [1, 0] if ta else [0, 1]), dims_map(3, [1, 2]), dims_map(3, [0, 2])]

        @linalg.generic([a_part, b], [c_part], maps, [PARALLEL, REDUCTION, PARALLEL])
        def block(x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
            return arith.addf(acc, arith.mulf(x, y, fastmath=fastmath), fastmath=fastmath)

        block.owner.attributes[ROW_BLOCK] = ir.UnitAttr.get()
        scf.yield_([_put(block, loop.inner_iter_args[0], [i, 0], [rows, n])])
    return loop.results[0]
