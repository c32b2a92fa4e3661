"""A convolution's columns packed straight from its image into a product's row panels.

``codegen.windows`` writes a convolution's columns (N * P * Q, C * KH * KW) as one copy
(a ``linalg.generic`` tagged IM2COL over (n, p, q, c, kh, kw), collapsed to two dims), and
the blocked CPU product (``cpu_matmul``) packs its A operand into row panels [m / t, k, t].
Written and read back, the columns cost two passes over N * P * Q * C * KH * KW floats (as
many again as the packing's own): when the output's row length Q splits into whole panels
(``panel_rows``), the panels are instead one gather from the (padded) image, panel (n, p,
qb), column (c, kh, kw), row r reading the pixel the columns' map reads at q = qb * t + r
(implicit GEMM packing). The loop over r is innermost and, at stride 1, contiguous in the
image and in the panel.

The columns as a product's B are gathered into a layout that the product reads in place,
its column panels being runs of ``tn`` consecutive values: pixel-major (``pixel_panels``)
for a product swapped for its few output channels (C^T = W @ columns^T), and pixel rows
padded to whole panels (``padded_columns``) for a weight gradient (dW = G^T @ columns).
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, bufferization, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import identity_map
from mlir_nn.codegen.shaped import dim_sizes, indexing_maps
from mlir_nn.codegen.walk import collect_ops

IM2COL = "mlirnn.im2col"  # on the columns' copy generic (n, p, q, c, kh, kw) until the products are rewritten
_COLLAPSED = [[0, 1, 2], [3, 4, 5]]


def drop_im2col_tags(module: ir.Module) -> None:
    """Untag the columns that products still read (a weight gradient's): the tag is for the
    product rewrite, and ``parallel_maps`` leaves tagged ops off threads."""
    for op in collect_ops(module, lambda op: IM2COL in op.attributes):
        del op.attributes[IM2COL]


def im2col_source(a: ir.Value) -> ir.Operation | None:
    """The IM2COL copy whose (N * P * Q, C * KH * KW) collapse ``a`` is, or None."""
    collapse = a.owner
    if isinstance(collapse, ir.Block) or collapse.name != "tensor.collapse_shape":
        return None
    groups = [[ir.IntegerAttr(i).value for i in g] for g in ir.ArrayAttr(collapse.attributes["reassociation"])]
    source = collapse.operands[0].owner
    if groups != _COLLAPSED or isinstance(source, ir.Block) or IM2COL not in source.attributes:
        return None
    return source


def panel_rows(q: int, tm: int) -> int | None:
    """Rows per panel for an output row of ``q`` pixels: the largest divisor of q from
    ceil(tm / 2) to the register block's ``tm`` (fewer rows per block than that leave
    too few accumulators to cover the FMA latency), or None."""
    return next((t for t in range(min(q, tm), (tm + 1) // 2 - 1, -1) if q % t == 0), None)


def im2col_panels(columns: ir.Operation, rows: int) -> ir.Value:
    """The row panels [N * P * Q / rows, C * KH * KW, rows] of the columns that the IM2COL
    copy ``columns`` writes, gathered from its image (``rows`` divides Q)."""
    image = columns.operands[0]
    read = indexing_maps(columns)[0]
    n, p, q, c, kh, kw = dim_sizes(columns.operands[1])
    d = [ir.AffineDimExpr.get(i) for i in range(7)]  # n p qb c kh kw r
    at_q = ir.AffineMap.get(7, 0, [d[0], d[1], d[2] * rows + d[6], d[3], d[4], d[5]])
    gather = ir.AffineMap.get(7, 0, [e.compose(at_q) for e in read.results])
    element = ir.RankedTensorType(image.type).element_type
    shape = [n, p, q // rows, c, kh, kw, rows]
    parallel = [linalg.IteratorType.parallel] * 7

    @linalg.generic([image], [tensor.empty(shape, element)], [gather, identity_map(7)], parallel)
    def panels(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    static = [ir.ShapedType.get_dynamic_size() if isinstance(n, ir.Value) else n * p * (q // rows),
              c * kh * kw, rows]
    return tensor.collapse_shape(ir.RankedTensorType.get(static, element), panels, [[0, 1, 2], [3, 4, 5], [6]])


def pixel_panels(columns: ir.Operation, lanes: int) -> ir.Value | None:
    """The columns that the IM2COL copy ``columns`` writes, pixel-major, as [C * KH * KW,
    N * P * Q / lanes, lanes]: a gather from its image over (c, kh, kw, n, p, q), the output
    row q innermost (contiguous in the image at stride 1), that a product swapped for its few
    columns reads as its B panels (panel j, k, lane r: pixel j * lanes + r) with no packing
    of its own. None for a dynamic batch or a pixel count that is no multiple of ``lanes``."""
    image = columns.operands[0]
    n, p, q, c, kh, kw = dim_sizes(columns.operands[1])
    if isinstance(n, ir.Value) or (n * p * q) % lanes:
        return None
    d = [ir.AffineDimExpr.get(i) for i in range(6)]  # c kh kw n p q
    at_pixel = ir.AffineMap.get(6, 0, [d[3], d[4], d[5], d[0], d[1], d[2]])
    gather = ir.AffineMap.get(6, 0, [e.compose(at_pixel) for e in indexing_maps(columns)[0].results])
    element = ir.RankedTensorType(image.type).element_type

    @linalg.generic([image], [tensor.empty([c, kh, kw, n, p, q], element)], [gather, identity_map(6)],
                    [linalg.IteratorType.parallel] * 6)
    def pixels(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return _pixel_major(pixels, [c * kh * kw, n * p * q], lanes)


def _pixel_major(pixels: ir.Value, flat: list[int], lanes: int) -> ir.Value:
    """[C, KH, KW, N, P, Q] as [C * KH * KW, N * P * Q / lanes, lanes]."""
    element = ir.RankedTensorType(pixels.type).element_type
    rows = tensor.collapse_shape(ir.RankedTensorType.get(flat, element), pixels, [[0, 1, 2], [3, 4, 5]])
    shape = [flat[0], flat[1] // lanes, lanes]
    return tensor.expand_shape(ir.RankedTensorType.get(shape, element), rows, [[0], [1, 2]], [], shape)


def padded_columns(columns: ir.Operation, lanes: int) -> ir.Value | None:
    """The columns that the IM2COL copy ``columns`` writes, each pixel's row zero-padded to
    whole ``lanes``-wide panels, as [N * P * Q, panels, lanes]: the gather from the image
    written straight into the rows' first C * KH * KW places, only the padding zeroed. A
    product whose B they are (a weight gradient, k the pixels) reads its column panels there,
    a run of ``lanes`` per pixel. None for a dynamic batch."""
    image = columns.operands[0]
    sizes = dim_sizes(columns.operands[1])
    if isinstance(sizes[0], ir.Value):
        return None
    n, p, q, c, kh, kw = sizes
    pixels, width = n * p * q, c * kh * kw
    panels = -(-width // lanes)
    element = ir.RankedTensorType(image.type).element_type
    rows = tensor.empty([pixels, panels * lanes], element)
    if panels * lanes > width:
        zero = arith.constant(element, 0.0)
        pad = [pixels, panels * lanes - width]

        @linalg.generic([], [_slice(rows, [0, width], pad)], [identity_map(2)], [linalg.IteratorType.parallel] * 2)
        def zeros(_out: ir.Value) -> ir.Value:
            return zero

        rows = tensor.insert_slice(zeros, rows, [], [], [], [0, width], pad, [1, 1])
    corner = _slice(rows, [0, 0], [pixels, width])
    into = tensor.expand_shape(ir.RankedTensorType.get(sizes, element), corner, _COLLAPSED, [], sizes)

    @linalg.generic([image], [tensor.empty(sizes, element)], indexing_maps(columns), [linalg.IteratorType.parallel] * 6)
    def gathered(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    # (written in place: an init that the gather does not read would be replaced by a fresh tensor)
    placed = bufferization.materialize_in_destination(into.type, gathered, into)
    flat = tensor.collapse_shape(ir.RankedTensorType.get([pixels, width], element), placed, _COLLAPSED)
    rows = tensor.insert_slice(flat, rows, [], [], [], [0, 0], [pixels, width], [1, 1])
    shape = [pixels, panels, lanes]
    return tensor.expand_shape(ir.RankedTensorType.get(shape, element), rows, [[0], [1, 2]], [], shape)


def _slice(value: ir.Value, offsets: list[int], sizes: list[int]) -> ir.Value:
    kind = ir.RankedTensorType.get(sizes, ir.RankedTensorType(value.type).element_type)
    return tensor.extract_slice(kind, value, [], [], [], offsets, sizes, [1] * len(sizes))

