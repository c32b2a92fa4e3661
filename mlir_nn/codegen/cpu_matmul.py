"""CPU code for matrix products: register-blocked vector kernels for large ones, loops for small ones.

``linalg.matmul`` ops are rewritten before the CPU pipeline runs:

* a large product (static column count, enough static work) becomes a plain
  ``linalg.matmul`` on row-major operands (transposed operands are first copied into
  row-major order, an O(size) copy against O(size^1.5) work) tagged for the transform
  schedule ``passes/cpu_matmul.mlir`` (register blocks of ``tm`` x ``tn``, vectorized to
  FMAs). Columns that do not fill a whole block go to a second, narrow product;
* a small product becomes a ``linalg.generic`` in the loop order whose innermost loop
  runs over contiguous memory: (k, m, n) when A is transposed and B is not (row
  updates of C), (m, k, n) when B is (k, n) (a row update, which LLVM vectorizes),
  (m, n, k) when B is transposed or rows are short (a dot product whose sum is marked
  ``reassoc`` so LLVM vectorizes the reduction).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, linalg, tensor
from mlir.dialects.transform import interpreter

from mlir_nn.backends.cpu_target import register_block
from mlir_nn.codegen.maps import dims_map, matmul_maps
from mlir_nn.pipelines import shipped_dir

PARALLEL = linalg.IteratorType.parallel
REDUCTION = linalg.IteratorType.reduction
ROW_MIN = 64  # shorter rows keep the dot-product loop order
TILED_WORK_MIN = 256  # static m * n * k (dynamic dims count as 1) from which a product is tiled
PARALLEL_WORK_MIN = 1 << 18  # static work from which a product's row blocks are spread over threads
SCHEDULE = "cpu_matmul.mlir"
WIDE, NARROW, PARALLEL_ROWS = "mlirnn.tiled", "mlirnn.narrow", "mlirnn.parallel"
TILED_TRANSPOSE, TRANSPOSE_TILE = "mlirnn.tiled_transpose", 16


def _operand_dims(amap: ir.AffineMap) -> list[int]:
    return [ir.AffineDimExpr(e).position for e in amap.results]


def _transposes(op: ir.Operation) -> tuple[bool, bool]:
    """(transpose_a, transpose_b) of a linalg.matmul from its indexing maps."""
    if "indexing_maps" not in op.attributes:
        return False, False
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    return _operand_dims(maps[0]) == [2, 0], _operand_dims(maps[1]) == [1, 2]


def _sizes(op: ir.Operation) -> tuple[int, int, int]:
    """(m, n, k) with MLIR's dynamic-size marker for the batch dim."""
    ta, _ = _transposes(op)
    a = ir.RankedTensorType(op.operands[0].type).shape
    c = ir.RankedTensorType(op.operands[2].type).shape
    return c[0], c[1], a[0] if ta else a[1]


def _static_work(op: ir.Operation) -> int:
    """m * n * k with dynamic dims counted as 1."""
    work = 1
    for d in _sizes(op):
        work *= 1 if ir.ShapedType.is_dynamic_size(d) else d
    return work


def _is_large(op: ir.Operation) -> bool:
    return not ir.ShapedType.is_dynamic_size(_sizes(op)[1]) and _static_work(op) >= TILED_WORK_MIN


def _as_generic(op: ir.Operation) -> ir.Value:
    a, b, c = op.operands
    ta, tb = _transposes(op)
    # matmul_maps use dims (m, n, k) = (0, 1, 2); choose the loop order, then renumber.
    n = ir.RankedTensorType(c.type).shape[1]
    row_update = not tb and (ir.ShapedType.is_dynamic_size(n) or n >= ROW_MIN)
    # A transposed (k, m) and B (k, n), e.g. a weight gradient: k outermost, so that every
    # inner loop reads rows (A[k, m] is a scalar, B[k, :] and C[m, :] contiguous).
    order = [2, 0, 1] if ta and not tb else [0, 2, 1] if row_update else [0, 1, 2]
    position = {dim: i for i, dim in enumerate(order)}
    maps = [dims_map(3, [position[d] for d in _operand_dims(m)]) for m in matmul_maps(ta, tb)]
    iterators = [REDUCTION if d == 2 else PARALLEL for d in order]
    fastmath = ir.Attribute.parse("#arith.fastmath<reassoc,contract>")

    @linalg.generic([a, b], [c], maps, iterators)
    def product(x: ir.Value, y: ir.Value, acc: ir.Value) -> ir.Value:
        return arith.addf(acc, arith.mulf(x, y, fastmath=fastmath), fastmath=fastmath)

    return product


def _dim_sizes(value: ir.Value) -> list[int | ir.Value]:
    kind = ir.RankedTensorType(value.type)
    return [tensor.dim(value, arith.constant(ir.IndexType.get(), i)) if kind.is_dynamic_dim(i) else d
            for i, d in enumerate(kind.shape)]


def _row_major(value: ir.Value) -> ir.Value:
    """A row-major copy of the transpose of a 2-D tensor (in square tiles when the sizes allow)."""
    rows, cols = _dim_sizes(value)
    out = tensor.empty([cols, rows], ir.RankedTensorType(value.type).element_type)
    copy = linalg.transpose(value, outs=[out], permutation=[1, 0])
    if all(isinstance(d, int) and d % TRANSPOSE_TILE == 0 for d in (rows, cols)):
        copy.attributes[TILED_TRANSPOSE] = ir.UnitAttr.get()
    return copy.results[0]


def _columns(value: ir.Value, start: int, width: int) -> ir.Value:
    """Columns [start, start + width) of a 2-D tensor."""
    rows, _ = _dim_sizes(value)
    dynamic = [rows] if isinstance(rows, ir.Value) else []
    static_rows = ir.ShapedType.get_dynamic_size() if dynamic else rows
    kind = ir.RankedTensorType.get([static_rows, width], ir.RankedTensorType(value.type).element_type)
    return tensor.extract_slice(kind, value, [], dynamic, [], [0, start], [static_rows, width], [1, 1])


def _insert_columns(part: ir.Value, into: ir.Value, start: int) -> ir.Value:
    rows, width = _dim_sizes(part)
    dynamic = [rows] if isinstance(rows, ir.Value) else []
    static_rows = ir.ShapedType.get_dynamic_size() if dynamic else rows
    return tensor.insert_slice(part, into, [], dynamic, [], [0, start], [static_rows, width], [1, 1])


def _tagged(a: ir.Value, b: ir.Value, c: ir.Value, tag: str, transpose_a: bool) -> ir.Value:
    maps = matmul_maps(transpose_a, False) if transpose_a else None
    product = linalg.matmul(a, b, outs=[c], indexing_maps=maps) if maps else linalg.matmul(a, b, outs=[c])
    product.owner.attributes[tag] = ir.UnitAttr.get()
    return product


def _as_blocked(op: ir.Operation, threads: bool) -> ir.Value:
    """Tagged products (B row-major): whole column blocks, then the narrower rest. The
    column blocks of a product with enough static work are also tagged to run their
    row blocks on several threads."""
    a, b, c = op.operands
    ta, tb = _transposes(op)
    b = _row_major(b) if tb else b
    _, n, _ = _sizes(op)
    _, tn = register_block(ir.FloatType(ir.RankedTensorType(c.type).element_type).width // 8)
    wide = n - n % tn
    parallel = threads and wide and _static_work(op) >= PARALLEL_WORK_MIN
    if wide in (0, n):
        product = _tagged(a, b, c, WIDE if wide else NARROW, ta)
        if parallel:
            product.owner.attributes[PARALLEL_ROWS] = ir.UnitAttr.get()
        return product
    left = _tagged(a, _columns(b, 0, wide), _columns(c, 0, wide), WIDE, ta)
    if parallel:
        left.owner.attributes[PARALLEL_ROWS] = ir.UnitAttr.get()
    right = _tagged(a, _columns(b, wide, n - wide), _columns(c, wide, n - wide), NARROW, ta)
    return _insert_columns(right, _insert_columns(left, c, 0), wide)


def _schedule_text(itemsize: int) -> str:
    tm, tn = register_block(itemsize)
    return (shipped_dir() / SCHEDULE).read_text().replace("{tm}", str(tm)).replace("{tn}", str(tn))


def _apply_schedule(module: ir.Module, itemsize: int) -> None:
    schedule = ir.Module.parse(_schedule_text(itemsize), module.context)
    entry = next(op for op in schedule.body.operations
                 if ir.StringAttr(op.attributes["sym_name"]).value == "mlirnn_cpu_matmul")
    try:
        interpreter.apply_named_sequence(module.operation, entry, schedule)
    except ValueError as error:
        raise RuntimeError(f"codegen: the CPU matmul schedule {SCHEDULE} failed: {error}") from None


def rewrite_matmuls(module: ir.Module, threads: bool = True) -> tuple[int, int]:
    """Rewrite every linalg.matmul of ``module``: (blocked, looped) counts. With ``threads``,
    products with enough work spread their row blocks over threads."""
    matmuls: list[ir.Operation] = []

    def collect(op: ir.Operation) -> ir.WalkResult:
        if op.name == "linalg.matmul":
            matmuls.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    blocked, itemsize = 0, 4
    with module.context:
        for op in matmuls:
            large = _is_large(op)
            if large:
                itemsize = ir.FloatType(ir.RankedTensorType(op.result.type).element_type).width // 8
            with ir.InsertionPoint(op), op.location:
                replacement = _as_blocked(op, threads) if large else _as_generic(op)
            op.result.replace_all_uses_with(replacement)
            op.erase()
            blocked += large
        if blocked:
            _apply_schedule(module, itemsize)
    return blocked, len(matmuls) - blocked
