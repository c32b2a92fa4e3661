"""col2im: the columns of a transposed convolution summed into the image they cover.

A convolution's input gradient as a GEMM gives, per output pixel (n, p, q), a row of
columns (kh, kw, c): what that pixel sends to input position (p * stride + k * dilation - lo,
q * stride + m * dilation - lo), channel c. Each kernel tap (k, m) is one strided slice of
the image, so the sum is KH * KW element-wise adds, each of a (N, P, Q, C) slice of the
columns into a strided (N, P, Q, C) window of an NHWC accumulator padded by the
convolution's padding (in place: an extract_slice / insert_slice pair on the same
tensor), then one pass that crops the padding and moves channels back to NCHW. Both
sides of every add run along the contiguous channels; nothing is spread or gathered.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder
from mlir_nn.codegen.maps import dims_map, identity_map
from mlir_nn.ir.layouts import NCHW, nchw_shape
from mlir_nn.ir.shapes import Dim, Shape
from mlir_nn.ir.windows import Axis


def _static(sizes: list[int | ir.Value]) -> list[int]:
    return [ir.ShapedType.get_dynamic_size() if isinstance(d, ir.Value) else d for d in sizes]


def _dynamic(sizes: list[int | ir.Value]) -> list[ir.Value]:
    return [d for d in sizes if isinstance(d, ir.Value)]


def _tap(b: FunctionBuilder, cols: ir.Value, cols_shape: Shape, k: int, m: int) -> ir.Value:
    """Columns of tap (k, m): (N, P, Q, KH, KW, C) -> (N, P, Q, C), a rank-reducing view."""
    n, p, q, _, _, c = cols_shape
    sizes = b.sizes((n, p, q, 1, 1, c))
    kind = ir.RankedTensorType.get(_static(b.sizes((n, p, q, c))), b.element)
    return tensor.extract_slice(kind, cols, [], _dynamic(sizes), [], [0, 0, 0, k, m, 0], _static(sizes),
                                [1] * 6)


def scatter_columns(b: FunctionBuilder, cols: ir.Value, cols_shape: Shape, ys: Axis, xs: Axis,
                    out_shape: Shape, layout: str = NCHW) -> ir.Value:
    """Sum columns (N, P, Q, KH, KW, C) into the (N, C, H, W) (or NHWC) image their windows cover."""
    acc = b.filled(accumulator_shape(cols_shape, ys, xs), 0.0)
    return cropped(b, add_columns(b, cols, cols_shape, acc, ys, xs), ys, xs, out_shape, layout)


def accumulator_shape(cols_shape: Shape, ys: Axis, xs: Axis) -> tuple[Dim, ...]:
    """The padded NHWC image (N, H + padding, W + padding, C) that columns (N, P, Q, KH, KW, C) add into."""
    return (cols_shape[0], ys.padded, xs.padded, cols_shape[5])


def add_columns(b: FunctionBuilder, cols: ir.Value, cols_shape: Shape, acc: ir.Value, ys: Axis,
                xs: Axis) -> ir.Value:
    """``acc`` (``accumulator_shape``) with the columns (N, P, Q, KH, KW, C) added into the windows they cover."""
    n, p, q, kh, kw, c = cols_shape
    if xs.dilation == 1:
        return _row_runs(b, cols, cols_shape, acc, accumulator_shape(cols_shape, ys, xs), ys, xs)
    window = b.sizes((n, p, q, c))
    strides = [1, ys.stride, xs.stride, 1]
    for k in range(int(kh)):
        for m in range(int(kw)):
            offsets = [0, k * ys.dilation, m * xs.dilation, 0]
            kind = ir.RankedTensorType.get(_static(window), b.element)
            target = tensor.extract_slice(kind, acc, [], _dynamic(window), [], offsets, _static(window), strides)

            @linalg.generic([_tap(b, cols, cols_shape, k, m)], [target], [identity_map(4)] * 2, [PARALLEL] * 4)
            def added(v: ir.Value, total: ir.Value) -> ir.Value:
                return arith.addf(total, v)

            acc = tensor.insert_slice(added, acc, [], _dynamic(window), [], offsets, _static(window), strides)
    return acc


def _row_runs(b: FunctionBuilder, cols: ir.Value, cols_shape: Shape, acc: ir.Value, acc_shape: Shape, ys: Axis,
              xs: Axis) -> ir.Value:
    """The columns added into the NHWC accumulator in one pass over them, when the taps along
    a row are adjacent (no dilation along W): pixel (n, p, q) and row tap k send their KW * C
    columns (m, c), contiguous, to KW * C contiguous elements of accumulator row
    p * stride + k * dilation, from (q * stride) * C on. The loops run (n, p, q, k, j = m * C + c),
    j innermost (vector adds along both), the image's accumulator rows in cache while its
    columns stream by once; only loop n is parallel (windows of different p, q overlap).
    (KH * KW passes over strided slices of the columns took a tenth of LeNet-5's step.)"""
    n, p, q, kh, kw, c = cols_shape
    runs = b.sizes((n, p, q, kh, int(kw) * int(c)))
    rows = b.sizes((n, ys.padded, int(xs.padded) * int(c)))
    flat_cols = tensor.collapse_shape(ir.RankedTensorType.get(_static(runs), b.element), cols,
                                      [[0], [1], [2], [3], [4, 5]])
    flat_acc = tensor.collapse_shape(ir.RankedTensorType.get(_static(rows), b.element), acc, [[0], [1], [2, 3]])
    d = [ir.AffineDimExpr.get(i) for i in range(5)]
    at = ir.AffineMap.get(5, 0, [d[0], d[1] * ys.stride + d[3] * ys.dilation, d[2] * (xs.stride * int(c)) + d[4]])
    iterators = [PARALLEL] + [REDUCTION] * 4

    @linalg.generic([flat_cols], [flat_acc], [identity_map(5), at], iterators)
    def added(v: ir.Value, total: ir.Value) -> ir.Value:
        return arith.addf(total, v)

    sizes = b.sizes(acc_shape)
    kind = ir.RankedTensorType.get(_static(sizes), b.element)
    return tensor.expand_shape(kind, added, [[0], [1], [2, 3]], _dynamic(sizes), _static(sizes))


def cropped(b: FunctionBuilder, acc: ir.Value, ys: Axis, xs: Axis, out_shape: Shape, layout: str = NCHW) -> ir.Value:
    """The padded NHWC accumulator's (H, W) interior (a view) copied to NCHW (or NHWC, where an
    accumulator without padding is the result itself). The crop is a slice, not an offset in the
    copy's map: linalg takes each loop's extent from the first operand that indexes it plainly,
    which would be the padded accumulator."""
    n, c, h, w = nchw_shape(out_shape, layout)
    if layout != NCHW and (ys.padded, xs.padded) == (h, w):
        return acc
    sizes = b.sizes((n, h, w, c))
    kind = ir.RankedTensorType.get(_static(sizes), b.element)
    interior = tensor.extract_slice(kind, acc, [], _dynamic(sizes), [], [0, ys.lo, xs.lo, 0], _static(sizes),
                                    [1] * 4)
    read = identity_map(4) if layout != NCHW else dims_map(4, [0, 2, 3, 1])

    @linalg.generic([interior], [b.empty(out_shape)], [read, identity_map(4)], [PARALLEL] * 4)
    def result(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return result
