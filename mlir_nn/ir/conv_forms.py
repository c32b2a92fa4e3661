"""The form each CPU convolution takes, chosen by a shape-aware cost (one thread, in nanoseconds).

A convolution, its input gradient and its weight gradient each have several forms on the CPU:

- ``taps``: the direct tap sum (forward and weight gradient), one pass over the padded input
  that sums the C/G * KH * KW taps of each output row, vectorized along the row;
- ``gemm``: im2col + GEMM (ungrouped only): the packed product over columns gathered from the
  padded (for the input gradient: spread and padded) image, its rows moved back to NCHW;
- ``col2im``: the input gradient as the product (N * P * Q, O) @ (O, KH * KW * C), whose
  columns are added back into the image tap by tap;
- ``grouped``: the one generic loop nest over groups, the fallback of grouped convolutions.

Each form's cost is its multiply-adds at the rate that form reaches, plus the bytes it moves
(the padded copy, im2col columns packed, col2im columns written and added back, the transposes
to and from pixel rows) at a streaming rate, plus its kernel launches. ``conv_form`` returns the
cheapest available form; the code generator lowers that form and the e-graph's cost model
prices the node with the same cost, so extraction and lowering agree. The rates are
calibrated on one core by ``benchmarks/conv_forms.py``.

A convolution or gradient in NHWC (``layout="NHWC"``, ``mlir_nn.ir.layouts``) saves, in the form
that computes in NHWC (``NHWC_FORMS``: the GEMMs, col2im), the move between pixel rows and NCHW of
its output-sized image (``transpose_ns``: slower than streaming once out of cache), less what its
im2col loses gathering from few channels; its other forms run on images transposed to NCHW and
transpose their image result back, passes the NCHW op does not make.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from mlir_nn.ir.layouts import NCHW, layout_of, nchw_shape
from mlir_nn.ir.shapes import BATCH, Shape
from mlir_nn.ir.windows import Axis, axes_of

# Rates on one core of an AMD EPYC (znver4, AVX-512), fitted to benchmarks/conv_forms.py's timings:
# float32 multiply-adds per ns (float64: half)
GEMM_FMAS_PER_NS = 50.0  # the packed-matmul rate
GEMM_BLOCK = 2400  # products with fewer output elements (a weight gradient's O x C * KH * KW) run slower
TAPS_FMAS_PER_NS = 23.0  # the direct tap sum over at most TAPS_UNROLLED taps: LLVM unrolls them all
TAPS_UNROLLED = 32
TAPS_LOOPED_FMAS_PER_NS = 17.0  # the tap sum over more taps, a loop
STRIDED_TAPS = 1 / 3  # the share of the tap sum's rate left when its rows are read with a stride
GROUPED_FMAS_PER_NS = 10.0  # the generic loop nest: the taps' reduction innermost
BYTES_PER_NS = 20.0  # bytes streamed per ns (copies, packing, transposes, col2im's adds)
LAUNCH_NS = 1000.0  # one kernel of the step
VECTOR_BYTES = 64  # AVX-512
# An image moved between NCHW and NHWC (or pixel rows), read and written: at BYTES_PER_NS up to
# TRANSPOSE_CACHED_BYTES, at TRANSPOSE_BYTES_PER_NS beyond (one thread, benchmarks/conv_forms.py
# --layout both: 16.7 MB took 6.3-9.3 ms, 8.4 MB 2.5 ms, 1.2 MB and less 18-35 bytes/ns)
TRANSPOSE_BYTES_PER_NS = 5.0
TRANSPOSE_CACHED_BYTES = 6 << 20
# An NHWC im2col gathers each column along a row of pixels C values apart (NCHW: contiguous): the
# share of its bytes' time added per vector of channel bytes short (LeNet-5's 6-channel conv2:
# forward +40%, weight gradient +13%)
NHWC_GATHER = {"conv2d": 0.22, "conv2d_bias": 0.22, "conv2d_weight_grad": 0.1, "conv2d_weight_update": 0.1}
BATCH_ESTIMATE = 64  # a dynamic batch's size for the choice (every term but the launches scales with it)

FORM_ENV = "MLIR_NN_CONV_FORM"
CONV_OPS = ("conv2d", "conv2d_bias", "conv2d_input_grad", "conv2d_weight_grad", "conv2d_weight_update")


class ConvShape(NamedTuple):
    """The sizes a form's cost depends on: n images of c channels, o output channels in ``groups``
    groups, the windows' axes ``ys``/``xs`` over the input, and the element size."""

    n: int
    c: int
    o: int
    groups: int
    ys: Axis
    xs: Axis
    itemsize: int

    @property
    def taps(self) -> int:
        """Taps per output (C/G * KH * KW)."""
        return self.c // self.groups * self.ys.kernel * self.xs.kernel

    @property
    def fmas(self) -> float:
        """Multiply-adds of the convolution (the same for its two gradients)."""
        return float(self.n * self.o * self.ys.out * self.xs.out * self.taps)

    @property
    def pixels(self) -> int:
        return self.n * self.ys.out * self.xs.out

    @property
    def image(self) -> int:
        return self.n * self.c * self.ys.size * self.xs.size

    @property
    def padded(self) -> int:
        return self.n * self.c * self.ys.padded * self.xs.padded

    @property
    def out(self) -> int:
        return self.pixels * self.o


def conv_shape(op: str, in_shapes: Sequence[Shape], out_shape: Shape, attrs: dict[str, Any], batch: int,
               itemsize: int) -> ConvShape:
    """The ConvShape of a node of one of CONV_OPS; the batch dimension counts as ``batch``."""
    def size(d: Any) -> int:
        return batch if d == BATCH else int(d)

    if op in ("conv2d", "conv2d_bias"):
        x, w = in_shapes[0], in_shapes[1]
    elif op == "conv2d_input_grad":
        x, w = out_shape, in_shapes[1]
    else:  # weight gradients: (x, g, ...) -> w
        x, w = in_shapes[0], out_shape
    x = nchw_shape(x, layout_of(op, attrs))
    groups = int(attrs.get("groups", 1))
    ys, xs = axes_of(op, (int(x[2]), int(x[3])), (int(w[2]), int(w[3])), attrs)
    return ConvShape(size(x[0]), int(x[1]), int(w[0]), groups, ys, xs, itemsize)


def _ns(fmas: float, rate: float, moved: float, launches: int, itemsize: int) -> float:
    return fmas / (rate * 4 / itemsize) + moved / BYTES_PER_NS + launches * LAUNCH_NS


def _taps_fmas(s: ConvShape) -> float:
    """The tap sum's multiply-adds in units of its full rate: the rows' unfilled vector lanes (rows of
    stride 1 are widened to whole vectors when longer than one, the extra lanes wasted either way)
    and strided rows count as work, and a sum over many taps runs as a loop, at a lower rate."""
    lanes = VECTOR_BYTES // s.itemsize
    use = s.xs.out / (math.ceil(s.xs.out / lanes) * lanes) * (STRIDED_TAPS if s.xs.stride != 1 else 1.0)
    looped = TAPS_FMAS_PER_NS / TAPS_LOOPED_FMAS_PER_NS if s.taps > TAPS_UNROLLED else 1.0
    return s.fmas / use * looped


def forward_costs(s: ConvShape) -> dict[str, float]:
    """Nanoseconds of each available forward form."""
    b = s.itemsize
    pad = (s.image + s.padded) * b if s.padded != s.image else 0
    costs = {"taps": _ns(_taps_fmas(s), TAPS_FMAS_PER_NS, pad + s.padded * b + s.out * b, 2, b)}
    if s.groups == 1:
        # columns packed (gathered, then read by the product), product rows written, moved to NCHW
        costs["gemm"] = _ns(s.fmas, GEMM_FMAS_PER_NS, pad + 2 * s.pixels * s.taps * b + 4 * s.out * b, 3, b)
    else:
        costs["grouped"] = _ns(s.fmas, GROUPED_FMAS_PER_NS, pad + s.padded * b + s.out * b, 2, b)
    return costs


def weight_grad_costs(s: ConvShape) -> dict[str, float]:
    """Nanoseconds of each available weight-gradient form."""
    b = s.itemsize
    pad = (s.image + s.padded) * b if s.padded != s.image else 0
    partials = s.o * s.taps * s.xs.out * b  # the tap sum's per-column sums, then their sum
    costs = {"taps": _ns(_taps_fmas(s), TAPS_FMAS_PER_NS, pad + s.padded * b + s.out * b + 2 * partials, 3, b)}
    if s.groups == 1:
        # the gradient moved to pixel rows, the columns packed; a small (O, C * KH * KW) product is slower
        small = max(1.0, GEMM_BLOCK / (s.o * s.taps))
        costs["gemm"] = _ns(s.fmas * small, GEMM_FMAS_PER_NS, pad + 2 * s.out * b + 2 * s.pixels * s.taps * b, 3, b)
    else:
        costs["grouped"] = _ns(s.fmas, GROUPED_FMAS_PER_NS, pad + s.padded * b + s.out * b, 2, b)
    return costs


def input_grad_costs(s: ConvShape) -> dict[str, float]:
    """Nanoseconds of each available input-gradient form."""
    b = s.itemsize
    if s.groups != 1:
        return {"grouped": _ns(s.fmas, GROUPED_FMAS_PER_NS, 2 * s.padded * b + s.out * b, 2, b)}
    kernel = s.ys.kernel * s.xs.kernel
    # col2im: the gradient to pixel rows, the product's columns written and added back into the padded
    # NHWC image, which is cropped into NCHW
    columns = s.pixels * kernel * s.c
    col2im = _ns(s.fmas, GEMM_FMAS_PER_NS, 2 * s.out * b + 3 * columns * b + 3 * s.padded * b, 3 + kernel, b)
    # im2col: the gradient spread by the stride and padded by the window span, a stride-1 product over
    # every input pixel (stride^2 times the multiply-adds), its rows moved to NCHW
    spread = s.n * s.o * ((s.ys.out - 1) * s.ys.stride + 2 * s.ys.span - 1) * \
        ((s.xs.out - 1) * s.xs.stride + 2 * s.xs.span - 1)
    in_pixels = s.n * s.ys.size * s.xs.size
    gemm = _ns(s.fmas * in_pixels / s.pixels, GEMM_FMAS_PER_NS,
               (s.out + spread) * b + 2 * in_pixels * s.o * kernel * b + 4 * s.image * b, 3, b)
    return {"col2im": col2im, "gemm": gemm}


# The forms that compute in NHWC with no transpose (the others run NCHW between transposes), each with
# the image whose move between pixel rows and NCHW it saves: the output-sized one ("out": the result,
# or the output gradient read), or the input-sized one (the input gradient's GEMM rows)
NHWC_FORMS = {"conv2d": {"gemm": "out"}, "conv2d_bias": {"gemm": "out"},
              "conv2d_input_grad": {"col2im": "out", "gemm": "image"}, "conv2d_weight_grad": {"gemm": "out"},
              "conv2d_weight_update": {"gemm": "out"}}


def form_costs(op: str, s: ConvShape, layout: str = NCHW) -> dict[str, float]:
    """Nanoseconds of each form available to ``op`` (one of CONV_OPS) on the CPU, its images in
    ``layout``."""
    if op in ("conv2d", "conv2d_bias"):
        costs = forward_costs(s)
    elif op == "conv2d_input_grad":
        costs = input_grad_costs(s)
    else:
        costs = weight_grad_costs(s)
    if layout == NCHW:
        return costs
    b = s.itemsize
    gather = NHWC_GATHER.get(op, 0.0) * VECTOR_BYTES / (s.c * b) * 2 * s.pixels * s.taps * b / BYTES_PER_NS
    transposes = transpose_ns(s.image * b) + transpose_ns(s.out * b) + 2 * LAUNCH_NS  # the image in, the image out
    native = NHWC_FORMS[op]
    return {form: ns + (gather - transpose_ns({"out": s.out, "image": s.image}[native[form]] * b) - LAUNCH_NS
                        if form in native else transposes) for form, ns in costs.items()}


def transpose_ns(nbytes: float) -> float:
    """Nanoseconds of moving an image of ``nbytes`` between NCHW and NHWC (a transpose)."""
    return 2 * nbytes / (BYTES_PER_NS if nbytes <= TRANSPOSE_CACHED_BYTES else TRANSPOSE_BYTES_PER_NS)


def forced_form() -> str:
    """The form ``$MLIR_NN_CONV_FORM`` names ("" when unset): part of the compiled step's cache key."""
    return os.environ.get(FORM_ENV, "")


def conv_form(op: str, s: ConvShape, layout: str = NCHW) -> str:
    """The cheapest CPU form of ``op`` over shape ``s``, or the one ``$MLIR_NN_CONV_FORM`` names where
    that form is available (for calibration)."""
    costs = form_costs(op, s, layout)
    forced = forced_form()
    return forced if forced in costs else min(costs, key=costs.__getitem__)


def conv_cost_ns(op: str, s: ConvShape, layout: str = NCHW) -> float:
    """Nanoseconds of ``op`` in the form ``conv_form`` picks, with its fused epilogue (bias and
    activation: a pass over the output; the weight update: one over the weight)."""
    cost = min(form_costs(op, s, layout).values())
    if op == "conv2d_bias":
        cost += 2 * s.out * s.itemsize / BYTES_PER_NS
    elif op == "conv2d_weight_update":
        cost += 3 * s.o * s.taps * s.itemsize / BYTES_PER_NS
    return cost
