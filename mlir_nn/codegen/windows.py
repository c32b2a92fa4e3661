"""Lowerings of the window ops (``mlir_nn.ir.windows``): convolutions, pooling, pad.

Every window op is one ``linalg.generic`` whose input maps read ``o * stride + k * dilation``
from an operand padded in advance (``tensor.insert_slice`` into a filled tensor). Kernel
loops that no operand indexes directly get their extent from an unused ``(kh, kw)``
window operand, as linalg's own pooling ops do. Gradients that scatter (a transposed
convolution, the pooling gradients) gather instead: the output gradient is spread out by
the stride and padded by the window span, so that every input position reads a plain
window of it. On the CPU each convolution takes the form the shape-aware cost of
``mlir_nn.ir.conv_forms`` finds cheapest (``conv_form``): im2col + GEMM, an input gradient as a
GEMM whose columns are added back tap by tap (col2im, ``codegen.col2im``), or, forward and weight
gradient, the direct sum of its taps in one pass over the padded input, with no im2col at all.
Over a static batch with many output pixels, the CPU weight and col2im input gradients run per
chunk of images (CHUNK_PIXELS), as tasks, so that each chunk's columns stay in cache. The fused ops
the optimizer's conv rules make (``conv2d_bias``, ``conv2d_weight_update``) are the same
products with element-wise epilogues.

The forward ops' NHWC forms (``layout="NHWC"``, made by the optimizer's layout rules) have no
transposes of their own where the loop nest reads NHWC as easily: the GEMM convolution (its im2col
gathers from the NHWC image, its product rows are the NHWC result) and the max pool; the other
forms run on the image transposed to NCHW, their result transposed back (``_nchw_inside``), as the
cost of ``conv_forms`` counts them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, scf, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.batch_split import partials_added
from mlir_nn.codegen.batched_products import batch_tasks
from mlir_nn.codegen.builder import PARALLEL, REDUCTION, FunctionBuilder, Operand
from mlir_nn.codegen.col2im import accumulator_shape, add_columns, cropped, scatter_columns
from mlir_nn.codegen.im2col_panels import IM2COL
from mlir_nn.codegen.maps import dims_map, identity_map, matmul_maps, permutation_map
from mlir_nn.codegen.tensor_types import tensor_type
from mlir_nn.ir import Node, conv_forms, make_node
from mlir_nn.ir.layouts import NCHW, NHWC, TO_NCHW, TO_NHWC, layout_of, nchw_shape, without_layout
from mlir_nn.ir.shapes import BATCH, Dim, Shape
from mlir_nn.ir.windows import Axis, axes_of
from mlir_nn.support.cpu_target import vector_bytes

Rule = Callable[[FunctionBuilder, Node, list[Operand]], ir.Value]


def _d(i: int) -> ir.AffineExpr:
    return ir.AffineDimExpr.get(i)


def _map(n_dims: int, exprs: Sequence[ir.AffineExpr | int]) -> ir.AffineMap:
    return ir.AffineMap.get(n_dims, 0, [ir.AffineConstantExpr.get(e) if isinstance(e, int) else e for e in exprs])


def _slice_sizes(b: FunctionBuilder, shape: Shape) -> tuple[list[ir.Value], list[int]]:
    """(dynamic sizes, static sizes with the dynamic marker) of ``shape``, as slice ops take them."""
    sizes = b.sizes(shape)
    return ([v for v in sizes if isinstance(v, ir.Value)],
            [ir.ShapedType.get_dynamic_size() if isinstance(v, ir.Value) else v for v in sizes])


def place(b: FunctionBuilder, x: ir.Value, x_shape: Shape, out_shape: Shape, offsets: Sequence[int],
          strides: Sequence[int], fill: float) -> ir.Value:
    """out[i] = x[(i - offset) / stride] where that is a whole index inside ``x``, else ``fill``.

    Pads (positive offsets) and spreads by a stride as a strided ``tensor.insert_slice`` into a
    filled tensor (vector copies of contiguous runs); crops (negative offsets) and any box that
    overflows ``out_shape`` as a gather (one linalg.generic reading ``x`` by tensor.extract), and
    everything as that gather unless ``b.strided_copies`` (the CUDA runtime has no subviews).
    """
    if b.strided_copies and _inside(x_shape, out_shape, offsets, strides):
        dynamic, static = _slice_sizes(b, x_shape)
        return tensor.insert_slice(x, b.filled(out_shape, fill), [], dynamic, [], list(offsets), static, list(strides))
    rank = len(out_shape)

    @linalg.generic([], [b.empty(out_shape)], [identity_map(rank)], [PARALLEL] * rank)
    def result(_out: ir.Value) -> ir.Value:
        at, inside = [], None
        for d, (size, offset, stride) in enumerate(zip(x_shape, offsets, strides)):
            i = _index(b, d)
            if (offset, stride) == (0, 1) and (size == BATCH or size == out_shape[d]):
                at.append(i)
                continue
            rel = arith.subi(i, b.index(offset))
            fits = [arith.cmpi(arith.CmpIPredicate.sge, rel, b.index(0)),
                    arith.cmpi(arith.CmpIPredicate.slt, rel, b.index((int(size) - 1) * stride + 1))]
            if stride > 1:
                fits.append(arith.cmpi(arith.CmpIPredicate.eq, arith.remsi(rel, b.index(stride)), b.index(0)))
            for f in fits:
                inside = f if inside is None else arith.andi(inside, f)
            source = arith.divsi(rel, b.index(stride)) if stride > 1 else rel
            at.append(arith.select(inside, source, b.index(0)))  # a safe index where the fill is taken
        value = tensor.extract(x, at)
        return value if inside is None else arith.select(inside, value, b.scalar(fill))

    return result


def _inside(x_shape: Shape, out_shape: Shape, offsets: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether every element of ``x`` lands inside ``out_shape`` (nothing cropped)."""
    for size, out, offset, stride in zip(x_shape, out_shape, offsets, strides):
        if offset < 0:
            return False
        if size == BATCH or out == BATCH:
            if (size, out, offset, stride) != (BATCH, BATCH, 0, 1):
                return False
        elif offset + (int(size) - 1) * stride + 1 > int(out):
            return False
    return True


def reshape(b: FunctionBuilder, x: ir.Value, src: Shape, shape: Shape, groups: list[list[int]]) -> ir.Value:
    """``x`` in ``shape`` by splitting (expand) or merging (collapse) axes as ``groups`` says: a view."""
    kind = tensor_type(shape, b.dtype)
    if len(shape) < len(src):
        return tensor.collapse_shape(kind, x, groups)
    sizes = b.sizes(shape)
    dynamic = ir.ShapedType.get_dynamic_size()
    return tensor.expand_shape(kind, x, groups, [s for s in sizes if isinstance(s, ir.Value)],
                               [dynamic if isinstance(s, ir.Value) else int(s) for s in sizes])


_SPLIT_1 = [[0], [1, 2], [3], [4]]  # (N, C, H, W) <-> (N, G, C/G, H, W)
_SPLIT_0 = [[0, 1], [2], [3], [4]]  # (O, ...) <-> (G, O/G, ...)


def _padded(b: FunctionBuilder, x: ir.Value, shape: Shape, ys: Axis, xs: Axis, fill: float,
            layout: str = NCHW) -> ir.Value:
    """The NCHW (or NHWC) input padded to every extent its windows read."""
    if layout == NHWC:
        out, offsets = (shape[0], ys.padded, xs.padded, shape[3]), (0, ys.lo, xs.lo, 0)
    else:
        out, offsets = tuple(shape[:2]) + (ys.padded, xs.padded), (0, 0, ys.lo, xs.lo)
    if out == tuple(shape):
        return x
    return place(b, x, shape, out, offsets, (1, 1, 1, 1), fill)


def permuted(b: FunctionBuilder, x: ir.Value, shape: Shape, perm: tuple[int, ...]) -> ir.Value:
    """``x`` transposed: output axis j is input axis perm[j]."""
    out = tuple(shape[p] for p in perm)

    @linalg.generic([x], [b.empty(out)], [permutation_map(perm), identity_map(len(perm))], [PARALLEL] * len(perm))
    def result(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return result


def _nchw_inside(lower: Rule, images: tuple[int, ...] = (0,), image_out: bool = True) -> Rule:
    """``lower`` (an NCHW op's lowering) for the op's NHWC form: the image operands (``images``)
    transposed to NCHW, the NCHW op lowered, its result transposed back when an image."""

    def lowered(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
        inputs, operands = list(node.inputs), list(xs_)
        for i in images:
            operands[i] = permuted(b, b.tensor_of(xs_[i], inputs[i].shape), inputs[i].shape, TO_NCHW)
            inputs[i] = make_node("transpose", [inputs[i]], perm=TO_NCHW)
        twin = make_node(node.op, inputs, **without_layout(node.attr_dict))
        result = lower(b, twin, operands)
        return permuted(b, result, twin.shape, TO_NHWC) if image_out else result

    return lowered


def _window(b: FunctionBuilder, ys: Axis, xs: Axis) -> ir.Value:
    return b.empty((ys.kernel, xs.kernel))


def _index(b: FunctionBuilder, dim: int) -> ir.Value:
    return linalg.IndexOp(dim).result


def _as_float(b: FunctionBuilder, i: ir.Value) -> ir.Value:
    return arith.sitofp(b.element, arith.index_cast(ir.IntegerType.get_signless(64), i))


def _affine_index(b: FunctionBuilder, terms: Sequence[tuple[int, int]], constant: int) -> ir.Value:
    """sum(index(dim) * factor) + constant, as an index Value inside a linalg body."""
    total = b.index(constant)
    for dim, factor in terms:
        total = arith.addi(total, arith.muli(_index(b, dim), b.index(factor)))
    return total


def _windowed(a: Axis, out_dim: int, k_dim: int, offset: int = 0) -> ir.AffineExpr:
    return _d(out_dim) * a.stride + _d(k_dim) * a.dilation + offset


# ---------------------------------------------------------------------------- convolutions


def _conv_parts(node: Node, in_hw: tuple[int, int], kernel: tuple[int, int]) -> tuple[Axis, Axis, int]:
    ys, xs = axes_of(node.op, in_hw, kernel, node.attr_dict)
    return ys, xs, int(node.attr("groups"))


def conv_form(b: FunctionBuilder, node: Node) -> str:
    """The form a convolution node takes (``mlir_nn.ir.conv_forms``): on the CPU the cheapest by the
    shape-aware cost, the batch counted as ``conv_forms.BATCH_ESTIMATE`` when dynamic; elsewhere the GEMM
    forms, or the grouped loop nest for a grouped convolution."""
    if not b.strided_copies:
        return "gemm" if int(node.attr("groups")) == 1 else "grouped"
    shape = conv_forms.conv_shape(node.op, [i.shape for i in node.inputs], node.shape, node.attr_dict,
                                  conv_forms.BATCH_ESTIMATE, ir.FloatType(b.element).width // 8)
    return conv_forms.conv_form(node.op, shape, layout_of(node.op, node.attr_dict))


def _grouped(b: FunctionBuilder, x: ir.Value, shape: Shape, groups: int) -> ir.Value:
    """(N, C, ...) as (N, G, C/G, ...)."""
    grouped = (shape[0], groups, int(shape[1]) // groups) + tuple(shape[2:])
    return reshape(b, x, shape, grouped, _SPLIT_1)


def _weight_groups(b: FunctionBuilder, w: ir.Value, shape: Shape, groups: int) -> ir.Value:
    """(O, C/G, KH, KW) as (G, O/G, C/G, KH, KW)."""
    return reshape(b, w, shape, (groups, int(shape[0]) // groups) + tuple(shape[1:]), _SPLIT_0)


def _conv2d_direct(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    x_node, w_node = node.inputs[:2]
    o, cg, kh, kw = (int(d) for d in w_node.shape)
    ys, xs, groups = _conv_parts(node, tuple(x_node.shape[2:]), (kh, kw))
    x = _padded(b, xs_[0], x_node.shape, ys, xs, 0.0)
    x = _grouped(b, x, tuple(x_node.shape[:2]) + (ys.padded, xs.padded), groups)
    w = _weight_groups(b, xs_[1], w_node.shape, groups)
    out_shape = (node.shape[0], groups, o // groups, ys.out, xs.out)
    # loops: n g o oh ow | c kh kw
    n, g, oc, oh, ow, c, k, m = range(8)
    maps = [_map(8, [_d(n), _d(g), _d(c), _windowed(ys, oh, k), _windowed(xs, ow, m)]),
            _map(8, [_d(g), _d(oc), _d(c), _d(k), _d(m)])]
    out = b.reduce(out_shape, [x, w], maps, _map(8, [_d(i) for i in (n, g, oc, oh, ow)]),
                   [PARALLEL] * 5 + [REDUCTION] * 3, arith.mulf)
    return reshape(b, out, out_shape, node.shape, _SPLIT_1)


def _conv2d_input_grad_direct(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    g_node, w_node = node.inputs
    o, cg, kh, kw = (int(d) for d in w_node.shape)
    ys, xs, groups = _conv_parts(node, tuple(node.shape[2:]), (kh, kw))
    spread = _spread_shape(g_node.shape, ys, xs)
    gz = place(b, xs_[0], g_node.shape, spread, (0, 0, ys.span - 1, xs.span - 1), (1, 1, ys.stride, xs.stride), 0.0)
    gz = _grouped(b, gz, spread, groups)
    w = _weight_groups(b, _flipped(b, xs_[1], w_node.shape), w_node.shape, groups)
    out_shape = (node.shape[0], groups, cg) + tuple(node.shape[2:])
    # loops: n g c i j | o k m
    n, g, c, i, j, oc, k, m = range(8)
    maps = [_map(8, [_d(n), _d(g), _d(oc), _d(i) + _d(k) * ys.dilation + ys.lo, _d(j) + _d(m) * xs.dilation + xs.lo]),
            _map(8, [_d(g), _d(oc), _d(c), _d(k), _d(m)]),
            _map(8, [_d(k), _d(m)])]
    out = b.reduce(out_shape, [gz, w, _window(b, ys, xs)], maps, _map(8, [_d(q) for q in (n, g, c, i, j)]),
                   [PARALLEL] * 5 + [REDUCTION] * 3, lambda gv, wv, _: arith.mulf(gv, wv))
    return reshape(b, out, out_shape, node.shape, _SPLIT_1)


def _flipped(b: FunctionBuilder, w: ir.Value, shape: Shape, layout: Shape | None = None) -> ir.Value:
    """The weight with both kernel axes reversed, read element by element (a map with a negative
    coefficient would do the same, but tiling rejects those); ``layout`` (O, KH, KW, C) also
    moves the input channels last."""
    kh, kw = int(shape[2]), int(shape[3])
    out = tuple(shape) if layout is None else layout
    o, c, k, m = (0, 1, 2, 3) if layout is None else (0, 3, 1, 2)  # loop of each weight axis

    @linalg.generic([], [b.empty(out)], [identity_map(4)], [PARALLEL] * 4)
    def result(_out: ir.Value) -> ir.Value:
        at = [_index(b, o), _index(b, c), arith.subi(b.index(kh - 1), _index(b, k)),
              arith.subi(b.index(kw - 1), _index(b, m))]
        return tensor.extract(w, at)

    return result


def _spread_shape(g_shape: Shape, ys: Axis, xs: Axis) -> Shape:
    """Extent of an output gradient spread by the stride and padded by the span on both sides,
    large enough for every input position's window (``i + lo + k * dilation``)."""

    return tuple(g_shape[:2]) + (_spread_extent(ys), _spread_extent(xs))


def _spread_extent(a: Axis) -> int:
    return max(a.size + a.lo + a.span - 1, (a.out - 1) * a.stride + 2 * a.span - 1)


def _conv2d_weight_grad_direct(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    x_node, g_node = node.inputs[:2]
    o, cg, kh, kw = (int(d) for d in node.shape)
    ys, xs, groups = _conv_parts(node, tuple(x_node.shape[2:]), (kh, kw))
    x = _padded(b, xs_[0], x_node.shape, ys, xs, 0.0)
    x = _grouped(b, x, tuple(x_node.shape[:2]) + (ys.padded, xs.padded), groups)
    gy = _grouped(b, xs_[1], g_node.shape, groups)
    out_shape = (groups, o // groups, cg, kh, kw)
    # loops: g o c k m | n oh ow
    g, oc, c, k, m, n, oh, ow = range(8)
    maps = [_map(8, [_d(n), _d(g), _d(oc), _d(oh), _d(ow)]),
            _map(8, [_d(n), _d(g), _d(c), _windowed(ys, oh, k), _windowed(xs, ow, m)])]
    out = b.reduce(out_shape, [gy, x], maps, _map(8, [_d(q) for q in range(5)]),
                   [PARALLEL] * 5 + [REDUCTION] * 3, arith.mulf)
    return reshape(b, out, out_shape, node.shape, _SPLIT_0)


def _contract() -> ir.Attribute:
    """Products and sums that LLVM may fuse into FMAs."""
    return ir.Attribute.parse("#arith.fastmath<contract>")


def _conv2d_taps(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """Each NCHW output row as the sum of its C/G * KH * KW taps in one pass over the output:
    loops (n, g, o, p | c, i, j | q), the output row's vectors innermost, summed over the taps
    (LLVM unrolls the tap loops and keeps the row's sums in registers), each tap reading the
    padded input along the row (contiguous, so the loop vectorizes) and one weight. A first
    layer's few input channels (LeNet's 1 x 5 x 5, a VGG's 3 x 3 x 3) gain nothing from a GEMM:
    its im2col rows, their packing and the transpose back to NCHW moved 25 times the input
    through memory."""
    x_node, w_node = node.inputs[:2]
    o, _, kh, kw = (int(d) for d in w_node.shape)
    ys, xs, groups = _conv_parts(node, tuple(x_node.shape[2:]), (kh, kw))
    wide = _whole_vectors(b, xs)
    x = _padded(b, xs_[0], x_node.shape, ys, wide, 0.0)
    x = _grouped(b, x, tuple(x_node.shape[:2]) + (ys.padded, wide.padded), groups)
    w = _weight_groups(b, b.tensor_of(xs_[1], w_node.shape), w_node.shape, groups)
    n, g, oc, p, c, i, j, q = range(8)
    maps = [_map(8, [_d(n), _d(g), _d(c), _windowed(ys, p, i), _windowed(wide, q, j)]),
            _map(8, [_d(g), _d(oc), _d(c), _d(i), _d(j)]),
            _map(8, [_d(n), _d(g), _d(oc), _d(p), _d(q)])]
    out_shape = (x_node.shape[0], groups, o // groups, ys.out, xs.out)
    iterators = [PARALLEL] * 4 + [REDUCTION] * 3 + [PARALLEL]

    @linalg.generic([x, w], [b.filled(out_shape[:4] + (wide.out,), 0.0)], maps, iterators)
    def summed(xv: ir.Value, wv: ir.Value, total: ir.Value) -> ir.Value:
        return arith.addf(total, arith.mulf(xv, wv, fastmath=_contract()), fastmath=_contract())

    return reshape(b, _first_columns(b, summed, out_shape), out_shape, node.shape, _SPLIT_1)


def _whole_vectors(b: FunctionBuilder, xs: Axis) -> Axis:
    """``xs`` with its output extent rounded up to whole vector registers when it spans more than
    one and has stride 1 (the input padded further on the right): the passes over taps run along
    output rows, and LLVM unrolled LeNet's 28-wide rows into 4-lane vectors."""
    lanes = vector_bytes() * 8 // ir.FloatType(b.element).width
    if xs.stride != 1 or xs.out <= lanes or xs.out % lanes == 0:
        return xs
    wide = -(-xs.out // lanes) * lanes
    return xs._replace(hi=xs.hi + wide - xs.out, out=wide)


# vector registers that a weight gradient's taps may keep sums in (of 32 with AVX-512; the rest
# hold the gradient row and addresses)
TAP_SUMS_MAX = 24


def _vectors(b: FunctionBuilder, columns: int) -> int:
    """Vector registers that ``columns`` elements take."""
    return -(-columns * ir.FloatType(b.element).width // (vector_bytes() * 8))


def _first_columns(b: FunctionBuilder, x: ir.Value, shape: Shape) -> ir.Value:
    """The corner of ``x`` (a tensor as large or larger in its last dim) of ``shape``: a view."""
    if ir.RankedTensorType(x.type).shape[-1] == shape[-1]:
        return x
    dynamic, static = _slice_sizes(b, shape)
    rank = len(shape)
    return tensor.extract_slice(tensor_type(shape, b.dtype), x, [], dynamic, [], [0] * rank, static, [1] * rank)


def _conv2d_weight_grad_taps(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """The weight gradient of a convolution with few taps without im2col: one pass that adds
    g * input for every tap into a partial sum per (output channel, tap, output column), the
    column loop innermost and parallel (the adds vectorize along it, in whole vectors:
    ``_whole_vectors``; an image's input stays in L1 while its output channels pass), then a
    sum over the columns."""
    x_node, g_node = node.inputs[:2]
    o, cg, kh, kw = (int(d) for d in node.shape)
    ys, xs, groups = _conv_parts(node, tuple(x_node.shape[2:]), (kh, kw))
    wide = _whole_vectors(b, xs)  # the extra columns' partial sums are dropped before the sum
    x = _padded(b, xs_[0], x_node.shape, ys, wide, 0.0)
    x = _grouped(b, x, tuple(x_node.shape[:2]) + (ys.padded, wide.padded), groups)
    gy = b.tensor_of(xs_[1], g_node.shape)
    if wide.out != xs.out:
        wide_g = tuple(g_node.shape[:3]) + (wide.out,)
        gy = place(b, gy, g_node.shape, wide_g, (0, 0, 0, 0), (1, 1, 1, 1), 0.0)
    gy = _grouped(b, gy, tuple(g_node.shape[:3]) + (wide.out,), groups)
    # loops: n | g o c i | p | j q (the kw taps beside the columns: kw * vectors of independent
    # sums per output row, where taps outside the row loop chained one sum's FMAs), or, when
    # all kh * kw taps' sums of a row fit in registers, n | g o c | p | i j q: each gradient
    # row is loaded once for all taps (VGG-small's first layer: 20 loads per 18 FMAs, not 8 per 6)
    if kh * kw * _vectors(b, wide.out) <= TAP_SUMS_MAX:
        n, g, oc, c, p, i, j, q = range(8)
        iterators = [REDUCTION] + [PARALLEL] * 3 + [REDUCTION] + [PARALLEL] * 3
    else:
        n, g, oc, c, i, p, j, q = range(8)
        iterators = [REDUCTION] + [PARALLEL] * 4 + [REDUCTION, PARALLEL, PARALLEL]
    maps = [_map(8, [_d(n), _d(g), _d(oc), _d(p), _d(q)]),
            _map(8, [_d(n), _d(g), _d(c), _windowed(ys, p, i), _windowed(wide, q, j)]),
            _map(8, [_d(g), _d(oc), _d(c), _d(i), _d(j), _d(q)])]
    part_shape = (groups, o // groups, cg, kh, kw, xs.out)

    @linalg.generic([gy, x], [b.filled(part_shape[:5] + (wide.out,), 0.0)], maps, iterators)
    def partial(gv: ir.Value, xv: ir.Value, total: ir.Value) -> ir.Value:
        return arith.addf(total, arith.mulf(gv, xv, fastmath=_contract()), fastmath=_contract())

    partial = _first_columns(b, partial, part_shape)
    total = b.reduce(part_shape[:5], [partial], [identity_map(6)], _map(6, [_d(k) for k in range(5)]),
                     [PARALLEL] * 5 + [REDUCTION], lambda v: v)
    return reshape(b, total, part_shape[:5], node.shape, _SPLIT_0)


# ---------------------------------------------------------------------------- convolutions as GEMMs
# Ungrouped convolutions: an im2col gather of the (padded or spread) image into a row per
# output pixel, one linalg.matmul (rewritten into the blocked CPU kernels by cpu_matmul
# when large), and a transpose between the pixel-major rows and NCHW.


def _rows(n: Dim, *dims: int) -> Dim:
    """Size of (n, *dims) collapsed into one axis: dynamic when n is the batch."""
    return BATCH if n == BATCH else int(n) * math.prod(dims)


def _columns(b: FunctionBuilder, image: ir.Value, shape: Shape, out_hw: tuple[int, int], ys: Axis, xs: Axis,
             offset: tuple[int, int], stride: tuple[int, int], layout: str = NCHW) -> ir.Value:
    """(N * P * Q, C * KH * KW): row (n, p, q) holds image[n, :, p * stride + k * dilation + offset, ...]
    (``shape``: the image's NCHW shape; ``layout``: the image's own)."""
    n, c = shape[0], int(shape[1])
    p, q = out_hw
    cols_shape = (n, p, q, c, ys.kernel, xs.kernel)
    rows = _d(1) * stride[0] + _d(4) * ys.dilation + offset[0]
    columns = _d(2) * stride[1] + _d(5) * xs.dilation + offset[1]
    read = _map(6, [_d(0), rows, columns, _d(3)] if layout == NHWC else [_d(0), _d(3), rows, columns])

    @linalg.generic([image], [b.empty(cols_shape)], [read, identity_map(6)], [PARALLEL] * 6)
    def cols(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    cols.owner.attributes[IM2COL] = ir.UnitAttr.get()  # the CPU products pack from the image instead
    return reshape(b, cols, cols_shape, (_rows(n, p, q), c * ys.kernel * xs.kernel), [[0, 1, 2], [3, 4, 5]])


def _product(b: FunctionBuilder, a: ir.Value, w: ir.Value, shape: Shape, leading: Shape, transpose_a: bool,
             transpose_b: bool) -> ir.Value:
    """op(a) @ op(w) into a zero-filled (rows, cols) accumulator; ``leading`` is what the rows collapse."""
    sizes = b.sizes(leading)
    rows = shape[0] if shape[0] != BATCH else arith.muli(sizes[0], b.index(math.prod(int(d) for d in leading[1:])))
    acc = linalg.fill(b.scalar(0.0), outs=[tensor.empty([rows, int(shape[1])], b.element)])
    if not transpose_a and not transpose_b:
        return linalg.matmul(a, w, outs=[acc])
    return linalg.matmul(a, w, outs=[acc], indexing_maps=matmul_maps(transpose_a, transpose_b))


def _nchw(b: FunctionBuilder, rows: ir.Value, nhwc: Shape) -> ir.Value:
    """(N * H * W, C) rows as an (N, C, H, W) tensor."""
    image = reshape(b, rows, (_rows(nhwc[0], *nhwc[1:3]), nhwc[3]), nhwc, [[0, 1, 2], [3]])
    nchw = (nhwc[0], nhwc[3], nhwc[1], nhwc[2])

    @linalg.generic([image], [b.empty(nchw)], [dims_map(4, [0, 2, 3, 1]), identity_map(4)], [PARALLEL] * 4)
    def result(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return result


def _pixel_rows(b: FunctionBuilder, x: ir.Value, shape: Shape) -> ir.Value:
    """(N, C, H, W) as (N * H * W, C) rows, made once per image in a block: a convolution's weight
    and input gradients read the same output gradient's rows (VGG-small: 2% of a step's time
    went into the second copy)."""
    made = b.pixel_rows.get(x)
    if made is not None and made.owner.operation.block == ir.InsertionPoint.current.block:
        return made
    b.pixel_rows[x] = rows = _transposed_rows(b, x, shape)
    return rows


def _transposed_rows(b: FunctionBuilder, x: ir.Value, shape: Shape) -> ir.Value:
    nhwc = (shape[0], shape[2], shape[3], shape[1])

    @linalg.generic([x], [b.empty(nhwc)], [dims_map(4, [0, 3, 1, 2]), identity_map(4)], [PARALLEL] * 4)
    def image(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return reshape(b, image, nhwc, (_rows(shape[0], *nhwc[1:3]), nhwc[3]), [[0, 1, 2], [3]])


def _conv2d(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    form = conv_form(b, node)
    layout = layout_of(node.op, node.attr_dict)
    if form == "gemm":
        return _conv2d_gemm(b, node, xs_, layout)
    if layout != NCHW:
        return _nchw_inside(_conv2d)(b, node, xs_)
    return _conv2d_taps(b, node, xs_) if form == "taps" else _conv2d_direct(b, node, xs_)


def _conv2d_gemm(b: FunctionBuilder, node: Node, xs_: list[Operand], layout: str) -> ir.Value:
    """im2col + GEMM: the product's rows are the NHWC result, moved to NCHW for an NCHW node."""
    x_node, w_node = node.inputs[:2]
    o, c, kh, kw = (int(d) for d in w_node.shape)
    image = nchw_shape(x_node.shape, layout)
    ys, xs = axes_of(node.op, tuple(image[2:]), (kh, kw), node.attr_dict)
    x = _padded(b, xs_[0], x_node.shape, ys, xs, 0.0, layout)
    cols = _columns(b, x, image, (ys.out, xs.out), ys, xs, (0, 0), (ys.stride, xs.stride), layout)
    w = reshape(b, xs_[1], w_node.shape, (o, c * kh * kw), [[0], [1, 2, 3]])
    nhwc = (x_node.shape[0], ys.out, xs.out, o)
    rows = _product(b, cols, w, (_rows(*nhwc[:3]), o), nhwc[:3], False, True)
    if layout == NHWC:
        return reshape(b, rows, (_rows(*nhwc[:3]), o), nhwc, [[0, 1, 2], [3]])
    return _nchw(b, rows, nhwc)


def _conv2d_bias(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """The convolution, then bias and activation as an element-wise epilogue (the tensor-level
    fusion merges it into the pass that moves the product's rows to NCHW)."""
    layout = layout_of(node.op, node.attr_dict)
    if layout != NCHW and conv_form(b, node) != "gemm":
        return _nchw_inside(_conv2d_bias)(b, node, xs_)
    conv = _conv2d(b, node, xs_)
    relu = node.attr("activation") == "relu"
    bias = b.tensor_of(xs_[2], node.inputs[2].shape)
    per_channel = node.inputs[2].shape  # (O,): along NHWC's last axis
    if layout == NCHW:
        per_channel = (node.shape[1], 1, 1)
        bias = reshape(b, bias, node.inputs[2].shape, per_channel, [[0, 1, 2]])

    def epilogue(v: ir.Value, bv: ir.Value) -> ir.Value:
        total = arith.addf(v, bv)
        return arith.maximumf(total, b.scalar(0.0)) if relu else total

    return b.elementwise(node.shape, [conv, bias], [node.shape, per_channel], epilogue, init=conv)


def _conv2d_weight_grad(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    form = conv_form(b, node)
    layout = layout_of(node.op, node.attr_dict)
    if layout != NCHW and form != "gemm":
        return _nchw_inside(_conv2d_weight_grad, (0, 1), image_out=False)(b, node, xs_)
    if form == "taps":
        return _conv2d_weight_grad_taps(b, node, xs_)
    if form == "grouped":
        return _conv2d_weight_grad_direct(b, node, xs_)
    x_node, g_node = node.inputs[:2]
    o, c, kh, kw = (int(d) for d in node.shape)
    image = nchw_shape(x_node.shape, layout)
    ys, xs = axes_of(node.op, tuple(image[2:]), (kh, kw), node.attr_dict)
    x = _padded(b, xs_[0], x_node.shape, ys, xs, 0.0, layout)
    grad = _image_rows(b, xs_[1], g_node.shape, layout)
    images = chunk_images(x_node.shape[0], ys.out * xs.out) if b.strided_copies else None
    if images is not None:
        flat = _weight_grad_in_chunks(b, x, grad, image, (o, c * kh * kw), ys, xs, images, layout)
    else:
        cols = _columns(b, x, image, (ys.out, xs.out), ys, xs, (0, 0), (ys.stride, xs.stride), layout)
        flat = _product(b, grad, cols, (o, c * kh * kw), (o,), True, False)
    return reshape(b, flat, (o, c * kh * kw), node.shape, [[0], [1, 2, 3]])


def _image_rows(b: FunctionBuilder, x: ir.Value, shape: Shape, layout: str) -> ir.Value:
    """An image as (N * H * W, C) pixel rows: a view of an NHWC image, made once from an NCHW one."""
    if layout == NCHW:
        return _pixel_rows(b, x, shape)
    return reshape(b, x, shape, (_rows(*shape[:3]), shape[3]), [[0, 1, 2], [3]])


# CPU weight and col2im input gradients over a static batch with more than 2 * CHUNK_PIXELS output
# pixels run per chunk of images of at most CHUNK_PIXELS pixels each (``_weight_grad_in_chunks``,
# ``_input_grad_in_chunks``): a chunk's columns (1024 x 288 floats, 1.2 MB, for VGG-small's second
# convolution) stay in cache between the pass that writes them and the one that reads them.
CHUNK_PIXELS = 1024


def chunk_images(n: Dim, pixels: int) -> int | None:
    """Images per chunk of a gradient over ``n`` images of ``pixels`` output pixels each: the
    largest divisor of n whose chunk has at most CHUNK_PIXELS pixels; None for a dynamic batch, too
    few pixels to split, or one image."""
    if n == BATCH or int(n) == 1 or int(n) * pixels <= 2 * CHUNK_PIXELS:
        return None
    return max(d for d in range(1, int(n)) if int(n) % d == 0 and (d * pixels <= CHUNK_PIXELS or d == 1))


def _weight_grad_in_chunks(b: FunctionBuilder, x: ir.Value, grad: ir.Value, x_shape: Shape, out: tuple[int, int],
                           ys: Axis, xs: Axis, images: int, layout: str = NCHW) -> ir.Value:
    """grad^T @ columns summed over chunks of ``images`` images: each chunk's columns (gathered from its
    slice of the padded input ``x``) are written just before its product reads them, in cache, where the
    whole batch's columns streamed from memory (VGG-small's second convolution at batch 128: 32768
    pixels of 288 columns, 38 MB). With ``b.batch_tasks`` the chunks run as tasks (``batch_tasks``),
    each summing its own chunks, the tasks' sums added at the end."""
    n, c, height, width = int(x_shape[0]), int(x_shape[1]), ys.padded, xs.padded
    pixels = images * ys.out * xs.out
    chunks = n // images
    tasks = batch_tasks(chunks) if b.batch_tasks else 1
    dynamic = ir.ShapedType.get_dynamic_size()

    def chunk_sum(first: ir.Value) -> ir.Value:
        """The sum of the products of chunks ``first`` to ``first + chunks / tasks``."""
        acc = linalg.fill(b.scalar(0.0), outs=[tensor.empty(list(out), b.element)])
        loop = scf.ForOp(first, arith.addi(first, b.index(chunks // tasks)), b.index(1), [acc])
        with ir.InsertionPoint(loop.body):
            image = arith.muli(loop.induction_variable, b.index(images))
            sizes = [images, c, height, width] if layout == NCHW else [images, height, width, c]
            part = tensor.extract_slice(ir.RankedTensorType.get(sizes, b.element), x, [image], [], [],
                                        [dynamic, 0, 0, 0], sizes, [1] * 4)
            cols = _columns(b, part, (images, c), (ys.out, xs.out), ys, xs, (0, 0), (ys.stride, xs.stride), layout)
            rows = tensor.extract_slice(ir.RankedTensorType.get([pixels, out[0]], b.element), grad,
                                        [arith.muli(image, b.index(ys.out * xs.out))], [], [], [dynamic, 0],
                                        [pixels, out[0]], [1, 1])
            product = _product(b, rows, cols, out, (out[0],), True, False)
            scf.yield_([_added(loop.inner_iter_args[0], product)])
        return loop.results[0]

    if tasks == 1:
        return chunk_sum(b.index(0))
    forall = scf.ForallOp([0], [tasks], [1], [tensor.empty([tasks, *out], b.element)])
    with ir.InsertionPoint(forall.body):
        task = forall.induction_variables[0]
        total = chunk_sum(arith.muli(task, b.index(chunks // tasks)))
        with ir.InsertionPoint(forall.terminator().block):
            tensor.parallel_insert_slice(total, forall.inner_iter_args[0], [task], [], [], [dynamic, 0, 0],
                                         [1, *out], [1, 1, 1])
    return partials_added(forall.results[0], linalg.fill(b.scalar(0.0), outs=[tensor.empty(list(out), b.element)]))


def _added(x: ir.Value, y: ir.Value) -> ir.Value:
    """x + y element-wise, into x."""
    rank = len(ir.RankedTensorType(x.type).shape)

    @linalg.generic([y], [x], [identity_map(rank)] * 2, [PARALLEL] * rank)
    def total(v: ir.Value, acc: ir.Value) -> ir.Value:
        return arith.addf(acc, v)

    return total


def _conv2d_weight_update(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """The weight gradient, then beta * c +- alpha * gradient as its element-wise epilogue."""
    grad = _conv2d_weight_grad(b, node, xs_)
    shapes = [i.shape for i in node.inputs[2:]]
    return b.scaled_update(node.shape, grad, xs_[2:], shapes, node.attr("subtract", False))


def _conv2d_input_grad(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """A stride-1 convolution of the spread gradient with the flipped, transposed weight."""
    form = conv_form(b, node)
    layout = layout_of(node.op, node.attr_dict)
    if form == "grouped":
        return _conv2d_input_grad_direct(b, node, xs_) if layout == NCHW else \
            _nchw_inside(_conv2d_input_grad)(b, node, xs_)
    if form == "col2im":
        return _conv2d_input_grad_col2im(b, node, xs_, layout)
    if not b.strided_copies and int(nchw_shape(node.shape, layout)[1]) < FEW_CHANNELS and str(b.element) != "f32":
        # (CUDA float32 products read the columns in place)
        return _conv2d_input_grad_gathered(b, node, xs_) if layout == NCHW else \
            _nchw_inside(_conv2d_input_grad)(b, node, xs_)
    g_node, w_node = node.inputs
    o, c, kh, kw = (int(d) for d in w_node.shape)
    n, _, h, wd = nchw_shape(node.shape, layout)
    ys, xs = axes_of(node.op, (int(h), int(wd)), (kh, kw), node.attr_dict)
    spread = _spread_shape(nchw_shape(g_node.shape, layout), ys, xs)  # NCHW
    if layout == NHWC:
        gz = place(b, xs_[0], g_node.shape, (spread[0], spread[2], spread[3], spread[1]),
                   (0, ys.span - 1, xs.span - 1, 0), (1, ys.stride, xs.stride, 1), 0.0)
    else:
        gz = place(b, xs_[0], g_node.shape, spread, (0, 0, ys.span - 1, xs.span - 1), (1, 1, ys.stride, xs.stride),
                   0.0)
    cols = _columns(b, gz, spread, (int(h), int(wd)), ys, xs, (ys.lo, xs.lo), (1, 1), layout)
    w = _flipped(b, xs_[1], w_node.shape, (o, kh, kw, c))
    w = reshape(b, w, (o, kh, kw, c), (o * kh * kw, c), [[0, 1, 2], [3]])
    nhwc = (n, int(h), int(wd), c)
    rows = _product(b, cols, w, (_rows(*nhwc[:3]), c), nhwc[:3], False, False)
    if layout == NHWC:
        return reshape(b, rows, (_rows(*nhwc[:3]), c), nhwc, [[0, 1, 2], [3]])
    return _nchw(b, rows, nhwc)


# CUDA float64: an input gradient with fewer input channels is a narrow product, summed back as a gather
# (_conv2d_input_grad_gathered); CUDA's float32 products read the spread gradient's columns through the
# window indexing, mlir_nn.gpu.gathers, where that form would add two buffers and two passes
FEW_CHANNELS = 16


def _conv2d_input_grad_col2im(b: FunctionBuilder, node: Node, xs_: list[Operand], layout: str = NCHW) -> ir.Value:
    """The wide product (N * P * Q, O) @ weight (O, KH * KW * C), then col2im: each kernel tap's
    columns added into the strided window of the image it covers (``codegen.col2im``)."""
    g_node, w_node = node.inputs
    o, c, kh, kw = (int(d) for d in w_node.shape)
    n, _, h, wd = nchw_shape(node.shape, layout)
    ys, xs = axes_of(node.op, (int(h), int(wd)), (kh, kw), node.attr_dict)
    p, q = ys.out, xs.out
    grad = _image_rows(b, xs_[0], g_node.shape, layout)
    w = _taps_last_channel(b, xs_[1], w_node.shape)
    images = chunk_images(n, p * q)
    if images is not None:
        return _input_grad_in_chunks(b, grad, w, (int(n), p, q, kh, kw, c), ys, xs, images, node.shape, layout)
    flat = _product(b, grad, w, (_rows(n, p, q), kh * kw * c), (n, p, q), False, False)
    cols_shape = (n, p, q, kh, kw, c)
    cols = reshape(b, flat, (_rows(n, p, q), kh * kw * c), cols_shape, [[0, 1, 2], [3, 4, 5]])
    return scatter_columns(b, cols, cols_shape, ys, xs, node.shape, layout)


def _input_grad_in_chunks(b: FunctionBuilder, grad: ir.Value, w: ir.Value, cols_shape: tuple[int, ...], ys: Axis,
                          xs: Axis, images: int, out_shape: Shape, layout: str = NCHW) -> ir.Value:
    """The col2im input gradient over chunks of ``images`` images (``chunk_images``): each chunk's
    columns, grad rows @ ``w``, are added into its images as soon as the product has written them, in
    cache, where the whole batch's columns streamed through memory (VGG-small's second convolution at
    batch 128: 32768 pixels of 288 columns, 38 MB). With ``b.batch_tasks`` the chunks run as tasks."""
    n, p, q, kh, kw, c = cols_shape
    chunk_cols = (images, p, q, kh, kw, c)
    acc_shape = accumulator_shape(chunk_cols, ys, xs)
    chunks = n // images
    tasks = batch_tasks(chunks) if b.batch_tasks else 1
    dynamic = ir.ShapedType.get_dynamic_size()

    def image_slice(x: ir.Value, first: ir.Value, count: int) -> ir.Value:
        kind = ir.RankedTensorType.get([count, *acc_shape[1:]], b.element)
        return tensor.extract_slice(kind, x, [first], [], [], [dynamic, 0, 0, 0], [count, *acc_shape[1:]], [1] * 4)

    def put(part: ir.Value, into: ir.Value, first: ir.Value) -> ir.Value:
        count = ir.RankedTensorType(part.type).shape[0]
        return tensor.insert_slice(part, into, [first], [], [], [dynamic, 0, 0, 0], [count, *acc_shape[1:]], [1] * 4)

    def chunks_added(acc: ir.Value, first: ir.Value) -> ir.Value:
        """``acc``, images ``first * images`` on of the batch, with the columns of its chunks added."""
        loop = scf.ForOp(b.index(0), b.index(chunks // tasks), b.index(1), [acc])
        with ir.InsertionPoint(loop.body):
            chunk = arith.addi(first, loop.induction_variable)
            at = arith.muli(loop.induction_variable, b.index(images))
            rows_shape = [images * p * q, ir.RankedTensorType(grad.type).shape[1]]
            rows = tensor.extract_slice(ir.RankedTensorType.get(rows_shape, b.element), grad,
                                        [arith.muli(chunk, b.index(rows_shape[0]))], [], [], [dynamic, 0], rows_shape,
                                        [1, 1])
            flat = _product(b, rows, w, (images * p * q, kh * kw * c), (images * p * q,), False, False)
            cols = reshape(b, flat, (images * p * q, kh * kw * c), chunk_cols, [[0, 1, 2], [3, 4, 5]])
            part = add_columns(b, cols, chunk_cols, image_slice(loop.inner_iter_args[0], at, images), ys, xs)
            scf.yield_([put(part, loop.inner_iter_args[0], at)])
        return loop.results[0]

    acc = b.filled((n, *acc_shape[1:]), 0.0)
    per_task = images * (chunks // tasks)
    if tasks == 1:
        acc = chunks_added(acc, b.index(0))
    else:
        forall = scf.ForallOp([0], [tasks], [1], [acc])
        with ir.InsertionPoint(forall.body):
            task = forall.induction_variables[0]
            first = arith.muli(task, b.index(per_task))
            done = chunks_added(image_slice(forall.inner_iter_args[0], first, per_task),
                                arith.muli(task, b.index(chunks // tasks)))
            with ir.InsertionPoint(forall.terminator().block):
                tensor.parallel_insert_slice(done, forall.inner_iter_args[0], [first], [], [], [dynamic, 0, 0, 0],
                                             [per_task, *acc_shape[1:]], [1] * 4)
        acc = forall.results[0]
    return cropped(b, acc, ys, xs, out_shape, layout)


def _conv2d_input_grad_gathered(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """The wide product (N * P * Q, O) @ flipped weight (O, C * KH * KW), spread by the stride, then
    each input position sums the window of it that covers the position (col2im as a gather, for
    targets without strided views)."""
    g_node, w_node = node.inputs
    o, c, kh, kw = (int(d) for d in w_node.shape)
    n, _, h, wd = node.shape
    ys, xs = axes_of(node.op, (int(h), int(wd)), (kh, kw), node.attr_dict)
    p, q = ys.out, xs.out
    grad = _pixel_rows(b, xs_[0], g_node.shape)
    w = reshape(b, _flipped(b, xs_[1], w_node.shape), w_node.shape, (o, c * kh * kw), [[0], [1, 2, 3]])
    flat = _product(b, grad, w, (_rows(n, p, q), c * kh * kw), (n, p, q), False, False)
    cols_shape = (n, p, q, c, kh, kw)
    cols = reshape(b, flat, (_rows(n, p, q), c * kh * kw), cols_shape, [[0, 1, 2], [3, 4, 5]])
    spread = (n, _spread_extent(ys), _spread_extent(xs), c, kh, kw)
    cols = place(b, cols, cols_shape, spread, (0, ys.span - 1, xs.span - 1, 0, 0, 0),
                 (1, ys.stride, xs.stride, 1, 1, 1), 0.0)
    # loops: n c i j | k m
    read = _map(6, [_d(0), _d(2) + _d(4) * ys.dilation + ys.lo, _d(3) + _d(5) * xs.dilation + xs.lo, _d(1), _d(4),
                    _d(5)])
    return b.reduce(node.shape, [cols], [read], _pool_out(), _POOL_LOOPS, lambda v: v)


def _taps_last_channel(b: FunctionBuilder, w: ir.Value, shape: Shape) -> ir.Value:
    """Weight (O, C, KH, KW) as (O, KH * KW * C): columns by kernel tap, channels contiguous."""
    o, c, kh, kw = (int(d) for d in shape)

    @linalg.generic([w], [b.empty((o, kh, kw, c))], [dims_map(4, [0, 3, 1, 2]), identity_map(4)], [PARALLEL] * 4)
    def moved(v: ir.Value, _out: ir.Value) -> ir.Value:
        return v

    return reshape(b, moved, (o, kh, kw, c), (o, kh * kw * c), [[0], [1, 2, 3]])


# ---------------------------------------------------------------------------- pooling


def _pool_axes(node: Node, in_hw: Sequence) -> tuple[Axis, Axis]:
    kernel = tuple(int(v) for v in node.attr("kernel"))
    return axes_of(node.op, tuple(int(v) for v in in_hw), kernel, node.attr_dict)


_POOL_LOOPS = [PARALLEL] * 4 + [REDUCTION] * 2  # n c oh ow | kh kw


def _pool_out() -> ir.AffineMap:
    return _map(6, [_d(i) for i in range(4)])


def _pool_maps(ys: Axis, xs: Axis, offset: tuple[int, int] = (0, 0),
               layout: str = NCHW) -> tuple[ir.AffineMap, ir.AffineMap]:
    """(windowed read of a padded image, the window operand) over loops n c oh ow kh kw (NHWC:
    n oh ow c kh kw)."""
    if layout == NHWC:
        return (_map(6, [_d(0), _windowed(ys, 1, 4, offset[0]), _windowed(xs, 2, 5, offset[1]), _d(3)]),
                _map(6, [_d(4), _d(5)]))
    return (_map(6, [_d(0), _d(1), _windowed(ys, 2, 4, offset[0]), _windowed(xs, 3, 5, offset[1])]),
            _map(6, [_d(4), _d(5)]))


def _max_or_nan(a: ir.Value, c: ir.Value) -> ir.Value:
    """The larger of a and c, NaN where either is (``arith.maximumf`` but for the sign of a zero
    maximum, which PyTorch's pool does not order either) as compare-and-select, which LLVM
    vectorizes: with ``maximumf`` LeNet-5's first 2x2 pool stayed scalar (1.07 ms against 0.37 ms
    at batch 256, one thread)."""
    larger = arith.select(arith.cmpf(arith.CmpFPredicate.OGT, a, c), a, c)
    return arith.select(arith.cmpf(arith.CmpFPredicate.UNO, a, c), arith.addf(a, c), larger)


def _max_pool2d(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    x_node = node.inputs[0]
    layout = layout_of(node.op, node.attr_dict)
    ys, xs = _pool_axes(node, nchw_shape(x_node.shape, layout)[2:])
    if b.strided_copies and _tiles(ys) and _tiles(xs):
        views = _window_views(b, b.tensor_of(xs_[0], x_node.shape), node.shape, ys, xs, layout)
        return b.elementwise(node.shape, views, [node.shape] * len(views),
                             lambda *vs: functools.reduce(_max_or_nan, vs))
    x = _padded(b, xs_[0], x_node.shape, ys, xs, float("-inf"), layout)
    reads, window = _pool_maps(ys, xs, layout=layout)
    return b.reduce(node.shape, [x, _window(b, ys, xs)], [reads, window], _pool_out(),
                    _POOL_LOOPS, lambda v, _: v,
                    init=float("-inf"), combine=arith.maximumf)


def _max_pool2d_index(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    """Smallest row-major input position in each window holding the window's maximum."""
    x_node = node.inputs[0]
    layout = layout_of(node.op, node.attr_dict)
    ys, xs = _pool_axes(node, nchw_shape(x_node.shape, layout)[2:])
    if b.strided_copies and _tiles(ys) and _tiles(xs):
        return _first_max_of_views(b, node, xs_, ys, xs, layout)
    if layout != NCHW:
        return _nchw_inside(_max_pool2d_index, (0, 1))(b, node, xs_)
    x = _padded(b, xs_[0], x_node.shape, ys, xs, float("-inf"))
    reads, window = _pool_maps(ys, xs)
    out = _pool_out()

    def position(v: ir.Value, best: ir.Value, _w: ir.Value) -> ir.Value:
        row = ((2, ys.stride * xs.size), (4, ys.dilation * xs.size), (3, xs.stride), (5, xs.dilation))
        pos = _as_float(b, _affine_index(b, row, -ys.lo * xs.size - xs.lo))
        return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, v, best), pos, b.scalar(float("inf")))

    return b.reduce(node.shape, [x, xs_[1], _window(b, ys, xs)], [reads, out, window], out, _POOL_LOOPS, position,
                    init=float("inf"), combine=arith.minimumf)


def _first_max_of_views(b: FunctionBuilder, node: Node, xs_: list[Operand], ys: Axis, xs: Axis,
                        layout: str = NCHW) -> ir.Value:
    """``_max_pool2d_index`` when the windows tile the input: one pass over the output reading
    each window position's strided view (``_window_views``), the first position (row-major)
    whose value is the maximum kept; it vectorizes along the output rows, where the reduction
    over each window stayed scalar (5% of LeNet-5's step at batch 256)."""
    x_node = node.inputs[0]
    views = _window_views(b, b.tensor_of(xs_[0], x_node.shape), node.shape, ys, xs, layout)
    offsets = [i * xs.size + j for i in range(ys.kernel) for j in range(xs.kernel)]
    h, w = (2, 3) if layout == NCHW else (1, 2)  # the loops of the output's rows and columns
    row = ((h, ys.stride * xs.size), (w, xs.stride))

    def first(*values: ir.Value) -> ir.Value:
        *window, best = values
        found = b.scalar(float("inf"))
        for v, offset in reversed(list(zip(window, offsets, strict=True))):  # the first match is chosen last
            found = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, v, best), b.scalar(float(offset)), found)
        return arith.addf(found, _as_float(b, _affine_index(b, row, 0)))  # one conversion per output

    # loops n c oh ow | u: the unit reduction loop u (read from an unused unit operand, as _window's)
    # keeps the pass out of elementwise fusion, which recomputed it per input position in the gradient
    outputs = _map(5, [_d(i) for i in range(4)])

    @linalg.generic(views + [b.tensor_of(xs_[1], node.shape), b.empty((1,))], [b.empty(node.shape)],
                    [outputs] * (len(views) + 1) + [_map(5, [_d(4)]), outputs], [PARALLEL] * 4 + [REDUCTION])
    def positions(*values: ir.Value) -> ir.Value:
        return first(*values[:-2])

    return positions


def _gather_windows(b: FunctionBuilder, node: Node, parts: list[tuple[ir.Value, float]], ys: Axis, xs: Axis,
                    fn: Callable[..., ir.Value]) -> ir.Value:
    """Pooling gradient: spread each (output-shaped operand, fill) and sum ``fn`` over the windows
    that cover each input position (loops n c i j | k m)."""
    g_shape = node.inputs[0].shape
    spread = _spread_shape(g_shape, ys, xs)
    spread_parts = [place(b, v, g_shape, spread, (0, 0, ys.span - 1, xs.span - 1), (1, 1, ys.stride, xs.stride), fill)
                    for v, fill in parts]
    read = _map(6, [_d(0), _d(1), _d(2) + _d(4) * ys.dilation + ys.lo, _d(3) + _d(5) * xs.dilation + xs.lo])
    maps = [read] * len(parts) + [_map(6, [_d(4), _d(5)])]
    return b.reduce(node.shape, spread_parts + [_window(b, ys, xs)], maps, _pool_out(),
                    _POOL_LOOPS, fn)


def _max_pool2d_grad(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    ys, xs = _pool_axes(node, node.attr("input_hw"))
    layout = layout_of(node.op, node.attr_dict)
    h, w = (2, 3) if layout == NCHW else (1, 2)  # the loops of the input's rows and columns

    def routed(g: ir.Value, index: ir.Value, _w: ir.Value) -> ir.Value:
        here = _as_float(b, _affine_index(b, ((h, xs.size), (w, 1)), 0))
        return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, index, here), g, b.scalar(0.0))

    if all(_tiles(a) for a in (ys, xs)):  # each input position lies in exactly one window: no sum
        return _per_tile(b, node, xs_, ys, xs, lambda g, index: routed(g, index, None), layout)
    if layout != NCHW:
        return _nchw_inside(_max_pool2d_grad, (0, 1))(b, node, xs_)
    return _gather_windows(b, node, [(xs_[0], 0.0), (xs_[1], -1.0)], ys, xs, routed)


def _window_views(b: FunctionBuilder, x: ir.Value, out_shape: Shape, ys: Axis, xs: Axis,
                  layout: str = NCHW) -> list[ir.Value]:
    """Per window position (i, j), in row-major order, the output-shaped strided view of ``x``
    (N, C, H, W, or N, H, W, C) that it reads, when the windows tile ``x`` (``_tiles``): a pass over
    the output reading these vectorizes along its rows, where a reduction over each window stayed
    scalar (LeNet-5's pools, 8% of its step)."""
    dynamic, static = _slice_sizes(b, out_shape)
    kind = tensor_type(out_shape, b.dtype)
    if layout == NHWC:
        return [tensor.extract_slice(kind, x, [], dynamic, [], [0, i, j, 0], static, [1, ys.stride, xs.stride, 1])
                for i in range(ys.kernel) for j in range(xs.kernel)]
    return [tensor.extract_slice(kind, x, [], dynamic, [], [0, 0, i, j], static, [1, 1, ys.stride, xs.stride])
            for i in range(ys.kernel) for j in range(xs.kernel)]


def _tiles(a: Axis) -> bool:
    """Windows that tile the input exactly: stride = kernel, no padding or dilation, no remainder."""
    return a.stride == a.kernel and a.dilation == 1 and a.lo == a.hi == 0 and a.out * a.kernel == a.size


def _per_tile(b: FunctionBuilder, node: Node, xs_: list[Operand], ys: Axis, xs: Axis,
              fn: Callable[..., ir.Value], layout: str = NCHW) -> ir.Value:
    """A pooling gradient when the windows tile the input: each input position reads its one window's
    operands (maps with floordiv) and gets ``fn`` of them."""
    h, w = (2, 3) if layout == NCHW else (1, 2)
    read = [_d(i) for i in range(4)]
    read[h] = ir.AffineExpr.get_floor_div(_d(h), ir.AffineConstantExpr.get(ys.kernel))
    read[w] = ir.AffineExpr.get_floor_div(_d(w), ir.AffineConstantExpr.get(xs.kernel))
    read = _map(4, read)
    operands = [b.tensor_of(v, node.inputs[0].shape) for v in xs_]

    @linalg.generic(operands, [b.empty(node.shape)], [read] * len(operands) + [identity_map(4)], [PARALLEL] * 4)
    def result(*args: ir.Value) -> ir.Value:
        return fn(*args[:-1])

    return result


def _divisor(b: FunctionBuilder, a: Axis, dim: int, count_include_pad: bool) -> ir.Value:
    """PyTorch's window length along one axis at output index ``dim`` (an index Value)."""
    start = _affine_index(b, ((dim, a.stride),), -a.lo)
    end = arith.minsi(arith.addi(start, b.index(a.kernel)), b.index(a.size + a.hi))
    if not count_include_pad:
        start = arith.maxsi(start, b.index(0))
        end = arith.minsi(end, b.index(a.size))
    return arith.subi(end, start)


def _scaled_by_divisor(b: FunctionBuilder, v: ir.Value, shape: Shape, ys: Axis, xs: Axis, cip: bool) -> ir.Value:
    """``v / divisor`` per output position of an average pool (NCHW, loops n c oh ow)."""

    @linalg.generic([v], [b.empty(shape)], [identity_map(4)] * 2, [PARALLEL] * 4)
    def result(value: ir.Value, _out: ir.Value) -> ir.Value:
        size = arith.muli(_divisor(b, ys, 2, cip), _divisor(b, xs, 3, cip))
        return arith.divf(value, _as_float(b, size))

    return result


def _avg_pool2d(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    if layout_of(node.op, node.attr_dict) != NCHW:
        return _nchw_inside(_avg_pool2d)(b, node, xs_)
    x_node = node.inputs[0]
    ys, xs = _pool_axes(node, x_node.shape[2:])
    x = _padded(b, xs_[0], x_node.shape, ys, xs, 0.0)
    reads, window = _pool_maps(ys, xs)
    total = b.reduce(node.shape, [x, _window(b, ys, xs)], [reads, window], _pool_out(),
                     _POOL_LOOPS, lambda v, _: v)
    return _scaled_by_divisor(b, total, node.shape, ys, xs, bool(node.attr("count_include_pad")))


def _avg_pool2d_grad(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    if layout_of(node.op, node.attr_dict) != NCHW:
        return _nchw_inside(_avg_pool2d_grad)(b, node, xs_)
    ys, xs = _pool_axes(node, node.attr("input_hw"))
    share = _scaled_by_divisor(b, xs_[0], node.inputs[0].shape, ys, xs, bool(node.attr("count_include_pad")))
    if all(_tiles(a) for a in (ys, xs)):
        return _per_tile(b, node, [share], ys, xs, lambda g: g)
    return _gather_windows(b, node, [(share, 0.0)], ys, xs, lambda g, _w: g)


def _adaptive(b: FunctionBuilder, node: Node, xs_: list[Operand], forward: bool) -> ir.Value:
    """out[n, c, i, j] = sum_hw x * a(i, h) * a(j, w) (forward) or its transpose (gradient), where
    a(i, h) is 1 / window length when h lies in PyTorch's adaptive window i, else 0."""
    src = node.inputs[0]
    small = node.shape[2:] if forward else src.shape[2:]
    big = src.shape[2:] if forward else node.shape[2:]
    # loops: n c p q | r s, where (p, q) index the output and (r, s) the reduced operand
    small_dims, big_dims = ((2, 3), (4, 5)) if forward else ((4, 5), (2, 3))

    def weight(axis_: int) -> ir.Value:
        i, h = _index(b, small_dims[axis_]), _index(b, big_dims[axis_])
        size, out = int(big[axis_]), int(small[axis_])
        start = arith.divui(arith.muli(i, b.index(size)), b.index(out))
        end = arith.divui(arith.addi(arith.muli(i, b.index(size)), b.index(size + out - 1)), b.index(out))
        inside = arith.andi(arith.cmpi(arith.CmpIPredicate.uge, h, start), arith.cmpi(arith.CmpIPredicate.ult, h, end))
        return arith.select(inside, arith.divf(b.scalar(1.0), _as_float(b, arith.subi(end, start))), b.scalar(0.0))

    read = _map(6, [_d(0), _d(1), _d(4), _d(5)])
    return b.reduce(node.shape, [xs_[0]], [read], _pool_out(), [PARALLEL] * 4 + [REDUCTION] * 2,
                    lambda v: arith.mulf(v, arith.mulf(weight(0), weight(1))))


# ---------------------------------------------------------------------------- pad


def _pad(b: FunctionBuilder, node: Node, xs_: list[Operand]) -> ir.Value:
    src = node.inputs[0].shape
    pads = [(int(lo), int(hi)) for lo, hi in node.attr("pads")]
    return place(b, b.tensor_of(xs_[0], src), src, node.shape, [lo for lo, _ in pads], [1] * len(src),
                 float(node.attr("value")))


WINDOW_LOWERINGS: dict[str, Rule] = {
    "conv2d": _conv2d,
    "conv2d_bias": _conv2d_bias,
    "conv2d_input_grad": _conv2d_input_grad,
    "conv2d_weight_grad": _conv2d_weight_grad,
    "conv2d_weight_update": _conv2d_weight_update,
    "max_pool2d": _max_pool2d,
    "max_pool2d_index": _max_pool2d_index,
    "max_pool2d_grad": _max_pool2d_grad,
    "avg_pool2d": _avg_pool2d,
    "avg_pool2d_grad": _avg_pool2d_grad,
    "adaptive_avg_pool2d": lambda b, n, xs: _adaptive(b, n, xs, forward=True),
    "adaptive_avg_pool2d_grad": lambda b, n, xs: _adaptive(b, n, xs, forward=False),
    "pad": _pad,
}
