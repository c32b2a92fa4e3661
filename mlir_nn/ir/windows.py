"""Ops over sliding windows of NCHW images: conv2d, pooling, pad, and their gradients.

Registered into the op registry (``mlir_nn.ir.ops``) when ``mlir_nn.ir`` is imported.
Attributes are resolved ints (the functional layer turns PyTorch's forms into them):
``stride``, ``dilation`` and ``kernel`` are (height, width) pairs, ``padding`` is
(top, bottom, left, right). Gradient ops carry the size they give back (``input_hw`` or
``kernel``), since a strided window does not determine it. The convolutions and the max and
average pools (and their gradients) also take ``layout`` (``mlir_nn.ir.layouts``): "NHWC" makes
their image operands and results (N, H, W, C) tensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mlir_nn.ir.layouts import in_layouts
from mlir_nn.ir.ops import Infer, Reference, TensorType, Vjp, register, same_dtype
from mlir_nn.ir.shapes import BATCH, Shape, ShapeError, fmt_shape

NEG_INF = float("-inf")


class Axis(NamedTuple):
    """Geometry of one spatial axis of a window op."""

    size: int  # input size
    kernel: int
    stride: int
    dilation: int
    lo: int  # padding before
    hi: int  # padding after
    out: int  # output size

    @property
    def span(self) -> int:
        """Input extent one window covers."""
        return self.dilation * (self.kernel - 1) + 1

    @property
    def padded(self) -> int:
        """Padded input extent that covers every window (ceil_mode may reach past ``hi``)."""
        return max(self.size + self.lo + self.hi, (self.out - 1) * self.stride + self.span)


def axis(op: str, size: int, kernel: int, stride: int, dilation: int, lo: int, hi: int,
         ceil_mode: bool = False) -> Axis:
    """One axis' geometry, checking that at least one window fits."""
    if min(kernel, stride, dilation) < 1 or min(lo, hi) < 0:
        raise ValueError(f"{op}: kernel {kernel}, stride {stride}, dilation {dilation} must be positive and "
                         f"padding ({lo}, {hi}) non-negative")
    extent = size + lo + hi - dilation * (kernel - 1) - 1
    if extent < 0:
        raise ShapeError(f"{op}: input size {size} with padding ({lo}, {hi}) is smaller than the window "
                         f"(kernel {kernel}, dilation {dilation}); expected at least {dilation * (kernel - 1) + 1}")
    out = -(-extent // stride) + 1 if ceil_mode else extent // stride + 1
    if ceil_mode and (out - 1) * stride >= size + lo:
        out -= 1  # PyTorch: the last window must start inside the input or its left padding
    return Axis(size, kernel, stride, dilation, lo, hi, out)


def _pair(attrs: dict[str, Any], name: str) -> tuple[int, int]:
    return tuple(int(v) for v in attrs[name])  # type: ignore[return-value]


def axes_of(op: str, hw: tuple[int, int], kernel: tuple[int, int], attrs: dict[str, Any]) -> tuple[Axis, Axis]:
    """Both spatial axes of a window op with these attributes over an input of size ``hw``."""
    stride = _pair(attrs, "stride")
    dilation = _pair(attrs, "dilation") if "dilation" in attrs else (1, 1)
    pad = tuple(int(v) for v in attrs["padding"])
    if len(pad) != 4:
        raise ValueError(f"{op}: padding must be (top, bottom, left, right), got {pad}")
    ceil = bool(attrs.get("ceil_mode", False))
    return (axis(op, hw[0], kernel[0], stride[0], dilation[0], pad[0], pad[1], ceil),
            axis(op, hw[1], kernel[1], stride[1], dilation[1], pad[2], pad[3], ceil))


def _image(op: str, t: TensorType, what: str = "input") -> tuple[Any, int, int, int]:
    if len(t.shape) != 4 or BATCH in t.shape[1:]:
        raise ShapeError(f"{op}: {what} must be NCHW (batch, channels, height, width), got {fmt_shape(t.shape)}")
    n, c, h, w = t.shape
    return n, int(c), int(h), int(w)


def _register(name: str, arity: int, infer: Infer, reference: Reference, vjp: Vjp | None, doc: str,
              images: tuple[int, ...], image_out: bool = True) -> None:
    """Register a window op taking either layout (``images``: its image operands)."""
    register(name, arity, *in_layouts(name, images, image_out, infer, reference, vjp),
             doc + " Layout: NCHW (default) or NHWC.")


# ---------------------------------------------------------------------------- NumPy helpers


def pad_array(x: np.ndarray, ys: Axis, xs: Axis, value: float) -> np.ndarray:
    """``x`` padded to the extents every window of ``ys``/``xs`` reads."""
    out = np.full(x.shape[:2] + (ys.padded, xs.padded), value, dtype=x.dtype)
    out[:, :, ys.lo:ys.lo + ys.size, xs.lo:xs.lo + xs.size] = x
    return out


def windows(xp: np.ndarray, ys: Axis, xs: Axis) -> np.ndarray:
    """View (N, C, OH, OW, KH, KW) of the windows of a padded image."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (n, c, ys.out, xs.out, ys.kernel, xs.kernel),
        (sn, sc, sh * ys.stride, sw * xs.stride, sh * ys.dilation, sw * xs.dilation), writeable=False)


def scatter_windows(cols: np.ndarray, ys: Axis, xs: Axis) -> np.ndarray:
    """Adjoint of ``windows`` followed by the crop of the padding: (N, C, OH, OW, KH, KW) -> (N, C, H, W)."""
    n, c = cols.shape[:2]
    acc = np.zeros((n, c, ys.padded, xs.padded), cols.dtype)
    for k in range(ys.kernel):
        for m in range(xs.kernel):
            r, s = k * ys.dilation, m * xs.dilation
            acc[:, :, r:r + (ys.out - 1) * ys.stride + 1:ys.stride,
                s:s + (xs.out - 1) * xs.stride + 1:xs.stride] += cols[:, :, :, :, k, m]
    return np.ascontiguousarray(acc[:, :, ys.lo:ys.lo + ys.size, xs.lo:xs.lo + xs.size])


# ---------------------------------------------------------------------------- conv2d


def conv_geometry(op: str, x: TensorType, w_shape: Shape, attrs: dict[str, Any]) -> tuple[Axis, Axis]:
    """Check an input and weight shape against conv attributes; the spatial axes."""
    _, c, h, wd = _image(op, x)
    if len(w_shape) != 4 or BATCH in w_shape:
        raise ShapeError(f"{op}: weight must be (out_channels, in_channels/groups, kh, kw), got {fmt_shape(w_shape)}")
    o, cg, kh, kw = (int(d) for d in w_shape)
    groups = int(attrs["groups"])
    if groups < 1 or c % groups or o % groups:
        raise ValueError(f"{op}: groups={groups} must divide in_channels ({c}) and out_channels ({o})")
    if cg != c // groups:
        raise ShapeError(f"{op}: weight {fmt_shape(w_shape)} expects {cg * groups} input channels "
                         f"(in_channels/groups = {cg}, groups={groups}), input {fmt_shape(x.shape)} has {c}")
    return axes_of(op, (h, wd), (kh, kw), attrs)


def _conv_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, w = types
    dtype = same_dtype("conv2d", types)
    ys, xs = conv_geometry("conv2d", x, w.shape, attrs)
    return TensorType((x.shape[0], w.shape[0], ys.out, xs.out), dtype)


def _grouped(a: np.ndarray, groups: int) -> np.ndarray:
    """(N, C, ...) -> (N, G, C/G, ...)."""
    return a.reshape(a.shape[:1] + (groups, a.shape[1] // groups) + a.shape[2:])


def conv2d_reference(x: np.ndarray, w: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    ys, xs = axes_of("conv2d", x.shape[2:], w.shape[2:], attrs)
    g = int(attrs["groups"])
    cols = _grouped(windows(pad_array(x, ys, xs, 0.0), ys, xs), g)  # N G Cg OH OW KH KW
    wg = w.reshape((g, w.shape[0] // g) + w.shape[1:])  # G Og Cg KH KW
    out = np.einsum("ngcpqkl,gockl->ngopq", cols, wg, optimize=True)
    return np.ascontiguousarray(out.reshape(x.shape[0], w.shape[0], ys.out, xs.out))


def conv2d_input_grad_reference(gy: np.ndarray, w: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    h, wd = attrs["input_hw"]
    ys, xs = axes_of("conv2d_input_grad", (h, wd), w.shape[2:], attrs)
    g = int(attrs["groups"])
    wg = w.reshape((g, w.shape[0] // g) + w.shape[1:])
    cols = np.einsum("ngopq,gockl->ngcpqkl", _grouped(gy, g), wg, optimize=True)
    cols = cols.reshape((gy.shape[0], g * w.shape[1]) + cols.shape[3:])
    return scatter_windows(cols, ys, xs)


def conv2d_weight_grad_reference(x: np.ndarray, gy: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    ys, xs = axes_of("conv2d_weight_grad", x.shape[2:], tuple(attrs["kernel"]), attrs)
    g = int(attrs["groups"])
    cols = _grouped(windows(pad_array(x, ys, xs, 0.0), ys, xs), g)
    out = np.einsum("ngcpqkl,ngopq->gockl", cols, _grouped(gy, g), optimize=True)
    return np.ascontiguousarray(out.reshape((gy.shape[1],) + out.shape[2:]))


def _conv_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: attrs[k] for k in ("stride", "padding", "dilation", "groups")}


def _vjp_conv(emit, xs, out, g, attrs):
    x, w = xs
    return [emit("conv2d_input_grad", g, w, input_hw=tuple(x.shape[2:]), **_conv_attrs(attrs)),
            emit("conv2d_weight_grad", x, g, kernel=tuple(w.shape[2:]), **_conv_attrs(attrs))]


def _conv_input_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    gy, w = types
    dtype = same_dtype("conv2d_input_grad", types)
    n, o, oh, ow = _image("conv2d_input_grad", gy, "output gradient")
    h, wd = (int(v) for v in attrs["input_hw"])
    c = int(w.shape[1]) * int(attrs["groups"]) if len(w.shape) == 4 else -1
    ys, xs = conv_geometry("conv2d_input_grad", TensorType((n, c, h, wd), dtype), w.shape, attrs)
    if (o, oh, ow) != (w.shape[0], ys.out, xs.out):
        raise ShapeError(f"conv2d_input_grad: output gradient {fmt_shape(gy.shape)} does not fit weight "
                         f"{fmt_shape(w.shape)} and input size {(h, wd)}; "
                         f"expected (N, {w.shape[0]}, {ys.out}, {xs.out})")
    return TensorType((n, c, h, wd), dtype)


def _conv_weight_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, gy = types
    dtype = same_dtype("conv2d_weight_grad", types)
    _, o, _, _ = _image("conv2d_weight_grad", gy, "output gradient")
    kh, kw = (int(v) for v in attrs["kernel"])
    w_shape = (o, x.shape[1] // max(int(attrs["groups"]), 1), kh, kw)
    ys, xs = conv_geometry("conv2d_weight_grad", x, w_shape, attrs)
    if gy.shape != (x.shape[0], o, ys.out, xs.out):
        raise ShapeError(f"conv2d_weight_grad: output gradient {fmt_shape(gy.shape)} does not fit input "
                         f"{fmt_shape(x.shape)}; expected ({x.shape[0]}, {o}, {ys.out}, {xs.out})")
    return TensorType(w_shape, dtype)


def _vjp_conv_input_grad(emit, xs, out, g, attrs):
    gy, w = xs
    return [emit("conv2d", g, w, **_conv_attrs(attrs)),
            emit("conv2d_weight_grad", g, gy, kernel=tuple(w.shape[2:]), **_conv_attrs(attrs))]


def _vjp_conv_weight_grad(emit, xs, out, g, attrs):
    x, gy = xs
    return [emit("conv2d_input_grad", gy, g, input_hw=tuple(x.shape[2:]), **_conv_attrs(attrs)),
            emit("conv2d", x, g, **_conv_attrs(attrs))]


_register("conv2d", 2, _conv_infer, lambda a, at, s: conv2d_reference(a[0], a[1], at), _vjp_conv,
         "2-D cross-correlation of NCHW x with weight (out, in/groups, kh, kw): stride, padding "
         "(top, bottom, left, right), dilation, groups.", (0,))
_register("conv2d_input_grad", 2, _conv_input_grad_infer,
         lambda a, at, s: conv2d_input_grad_reference(a[0], a[1], at), _vjp_conv_input_grad,
         "Gradient of conv2d wrt its input (a transposed convolution). Operands: (grad, weight); input_hw.", (0,))
_register("conv2d_weight_grad", 2, _conv_weight_grad_infer,
         lambda a, at, s: conv2d_weight_grad_reference(a[0], a[1], at), _vjp_conv_weight_grad,
         "Gradient of conv2d wrt its weight. Operands: (input, grad); kernel = (kh, kw).", (0, 1), False)


def _conv_bias_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    out = _conv_infer(types[:2], attrs)
    same_dtype("conv2d_bias", types)
    if types[2].shape != (out.shape[1],):
        raise ShapeError(f"conv2d_bias: bias has shape {fmt_shape(types[2].shape)}, expected ({out.shape[1]},) "
                         f"for output {fmt_shape(out.shape)}")
    if attrs.get("activation") not in ("none", "relu"):
        raise ValueError(f"conv2d_bias: unknown activation {attrs.get('activation')!r}; expected 'none' or 'relu'")
    return out


def conv2d_bias_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    out = conv2d_reference(x, w, attrs) + bias[:, None, None]
    return np.maximum(out, 0) if attrs["activation"] == "relu" else out


_register("conv2d_bias", 3, _conv_bias_infer, lambda a, at, s: conv2d_bias_reference(a[0], a[1], a[2], at), None,
         "act(conv2d(x, w) + b) with b (out_channels,) broadcast over (N, H, W); act is 'none' or 'relu'. "
         "Made by the optimizer's rules only.", (0,))


def _conv_update_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    out = _conv_weight_grad_infer(types[:2], attrs)
    same_dtype("conv2d_weight_update", types)
    if types[2].shape != out.shape:
        raise ShapeError(f"conv2d_weight_update: accumulator has shape {fmt_shape(types[2].shape)}, "
                         f"expected the weight's {fmt_shape(out.shape)}")
    for role, scale in zip(("alpha", "beta"), types[3:]):
        if scale.shape != ():
            raise ShapeError(f"conv2d_weight_update: {role} has shape {fmt_shape(scale.shape)}, expected a scalar ()")
    return out


def conv2d_weight_update_reference(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, gy, c, alpha, beta = args
    product = alpha * conv2d_weight_grad_reference(x, gy, attrs)
    return beta * c - product if attrs.get("subtract") else beta * c + product


_register("conv2d_weight_update", 5, _conv_update_infer, lambda a, at, s: conv2d_weight_update_reference(a, at), None,
         "beta * c + alpha * conv2d_weight_grad(x, grad) (minus the gradient when subtract), 0-d alpha and beta: "
         "an optimizer's update folded into the weight gradient, as gemm for products. Made by the optimizer's rules.",
          (0, 1), False)


# ---------------------------------------------------------------------------- pooling


def pool_geometry(op: str, x: TensorType, attrs: dict[str, Any]) -> tuple[Axis, Axis]:
    _, _, h, w = _image(op, x)
    kernel = _pair(attrs, "kernel")
    pad = tuple(int(v) for v in attrs["padding"])
    if len(pad) == 4 and (2 * max(pad[0], pad[1]) > kernel[0] or 2 * max(pad[2], pad[3]) > kernel[1]):
        raise ValueError(f"{op}: padding {pad} must be at most half the kernel {kernel}")
    return axes_of(op, (h, w), kernel, attrs)


def _pool_infer(op: str):
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        (x,) = types
        ys, xs = pool_geometry(op, x, attrs)
        return TensorType(x.shape[:2] + (ys.out, xs.out), x.dtype)

    return infer


def _pool_grad_infer(op: str, operands: int):
    """Rule of a pooling gradient: operands of the pooled output's shape, the input's shape back."""

    def infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
        dtype = same_dtype(op, types)
        n, c, _, _ = _image(op, types[0], "output gradient")
        source = TensorType((n, c) + tuple(int(v) for v in attrs["input_hw"]), dtype)
        ys, xs = pool_geometry(op, source, attrs)
        for t in types:
            if t.shape != (n, c, ys.out, xs.out):
                raise ShapeError(f"{op}: operand {fmt_shape(t.shape)} does not fit input size {attrs['input_hw']}; "
                                 f"expected ({n}, {c}, {ys.out}, {xs.out})")
        return source

    return infer


def max_pool_reference(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    ys, xs = axes_of("max_pool2d", x.shape[2:], _pair(attrs, "kernel"), attrs)
    return np.ascontiguousarray(windows(pad_array(x, ys, xs, NEG_INF), ys, xs).max(axis=(4, 5)))


def max_pool_index_reference(x: np.ndarray, out: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """Row-major position (h * W + w) in the input of each window's first maximum."""
    ys, xs = axes_of("max_pool2d_index", x.shape[2:], _pair(attrs, "kernel"), attrs)
    cols = windows(pad_array(x, ys, xs, NEG_INF), ys, xs)
    first = np.argmax(cols.reshape(cols.shape[:4] + (-1,)) == out[..., None], axis=4)
    k, m = np.divmod(first, xs.kernel)
    rows = np.arange(ys.out)[:, None] * ys.stride + k * ys.dilation - ys.lo
    cols_ = np.arange(xs.out)[None, :] * xs.stride + m * xs.dilation - xs.lo
    return (rows * xs.size + cols_).astype(x.dtype)


def max_pool_grad_reference(gy: np.ndarray, index: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    h, w = attrs["input_hw"]
    n, c = gy.shape[:2]
    flat = np.zeros((n * c, h * w), gy.dtype)
    rows = np.repeat(np.arange(n * c), gy.shape[2] * gy.shape[3])
    np.add.at(flat, (rows, index.reshape(-1).astype(np.int64)), gy.reshape(-1))
    return flat.reshape(n, c, h, w)


def _vjp_max_pool(emit, xs, out, g, attrs):
    index = emit("max_pool2d_index", xs[0], out, **attrs)
    return [emit("max_pool2d_grad", g, index, input_hw=tuple(xs[0].shape[2:]), **attrs)]


def _max_pool_index_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, out = types
    same_dtype("max_pool2d_index", types)
    expected = _pool_infer("max_pool2d_index")([x], attrs)
    if out.shape != expected.shape:
        raise ShapeError(f"max_pool2d_index: pooled output {fmt_shape(out.shape)} does not fit input "
                         f"{fmt_shape(x.shape)}; expected {fmt_shape(expected.shape)}")
    return expected


_register("max_pool2d", 1, _pool_infer("max_pool2d"), lambda a, at, s: max_pool_reference(a[0], at), _vjp_max_pool,
         "Maximum over kernel windows of NCHW x (padding reads -inf): stride, padding, dilation, ceil_mode.", (0,))
_register("max_pool2d_index", 2, _max_pool_index_infer,
         lambda a, at, s: max_pool_index_reference(a[0], a[1], at), lambda emit, xs, out, g, at: [None, None],
         "Input position h * W + w of each window's first maximum (PyTorch's ties). Operands: (x, pooled).", (0, 1))
_register("max_pool2d_grad", 2, _pool_grad_infer("max_pool2d_grad", 2),
         lambda a, at, s: max_pool_grad_reference(a[0], a[1], at), None,
         "Backward of max_pool2d: each window's grad added at its first maximum. Operands: (grad, index).", (0, 1))


def avg_divisor(ys: Axis, xs: Axis, count_include_pad: bool) -> np.ndarray:
    """PyTorch's divisor per output position (OH, OW): the window clipped to the padded input,
    or to the input itself unless ``count_include_pad``."""

    def per_axis(a: Axis) -> np.ndarray:
        start = np.arange(a.out) * a.stride - a.lo
        end = np.minimum(start + a.kernel, a.size + a.hi)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, a.size)
        return end - start

    return np.outer(per_axis(ys), per_axis(xs))


def avg_pool_reference(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    ys, xs = axes_of("avg_pool2d", x.shape[2:], _pair(attrs, "kernel"), attrs)
    total = windows(pad_array(x, ys, xs, 0.0), ys, xs).sum(axis=(4, 5))
    return np.ascontiguousarray(total / avg_divisor(ys, xs, bool(attrs["count_include_pad"])).astype(x.dtype))


def avg_pool_grad_reference(gy: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    ys, xs = axes_of("avg_pool2d_grad", tuple(attrs["input_hw"]), _pair(attrs, "kernel"), attrs)
    share = gy / avg_divisor(ys, xs, bool(attrs["count_include_pad"])).astype(gy.dtype)
    cols = np.broadcast_to(share[..., None, None], share.shape + (ys.kernel, xs.kernel))
    return scatter_windows(cols, ys, xs)


_register("avg_pool2d", 1, _pool_infer("avg_pool2d"), lambda a, at, s: avg_pool_reference(a[0], at),
         lambda emit, xs, out, g, at: [emit("avg_pool2d_grad", g, input_hw=tuple(xs[0].shape[2:]), **at)],
         "Mean over kernel windows of NCHW x: stride, padding (zeros), ceil_mode, count_include_pad.", (0,))
_register("avg_pool2d_grad", 1, _pool_grad_infer("avg_pool2d_grad", 1),
         lambda a, at, s: avg_pool_grad_reference(a[0], at),
         lambda emit, xs, out, g, at: [emit("avg_pool2d", g, **{k: v for k, v in at.items() if k != "input_hw"})],
         "Backward of avg_pool2d: each window's grad shared over it by the forward's divisor.", (0,))


def adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows: [floor(i * size / out), ceil((i + 1) * size / out))."""
    i = np.arange(out)
    return (i * size) // out, -(-((i + 1) * size) // out)


def adaptive_matrix(size: int, out: int, dtype: Any) -> np.ndarray:
    """(out, size) averaging matrix of one axis."""
    start, end = adaptive_bounds(size, out)
    j = np.arange(size)
    inside = (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])
    return (inside / (end - start)[:, None]).astype(dtype)


def _adaptive_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    _image("adaptive_avg_pool2d", x)
    oh, ow = _pair(attrs, "output_size")
    if oh < 1 or ow < 1:
        raise ValueError(f"adaptive_avg_pool2d: output_size {(oh, ow)} must be positive")
    return TensorType(x.shape[:2] + (oh, ow), x.dtype)


def _adaptive_grad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (g,) = types
    _image("adaptive_avg_pool2d_grad", g, "output gradient")
    h, w = _pair(attrs, "input_hw")
    if min(h, w) < 1:
        raise ValueError(f"adaptive_avg_pool2d_grad: input_hw {(h, w)} must be positive")
    return TensorType(g.shape[:2] + (h, w), g.dtype)


def _adaptive_reference(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    a = adaptive_matrix(x.shape[2], out_hw[0], x.dtype)
    b = adaptive_matrix(x.shape[3], out_hw[1], x.dtype)
    return np.ascontiguousarray(np.einsum("ih,nchw,jw->ncij", a, x, b, optimize=True))


def _adaptive_grad_reference(g: np.ndarray, in_hw: tuple[int, int]) -> np.ndarray:
    a = adaptive_matrix(in_hw[0], g.shape[2], g.dtype)
    b = adaptive_matrix(in_hw[1], g.shape[3], g.dtype)
    return np.ascontiguousarray(np.einsum("ih,ncij,jw->nchw", a, g, b, optimize=True))


register("adaptive_avg_pool2d", 1, _adaptive_infer,
         lambda a, at, s: _adaptive_reference(a[0], _pair(at, "output_size")),
         lambda emit, xs, out, g, at: [emit("adaptive_avg_pool2d_grad", g, input_hw=tuple(xs[0].shape[2:]))],
         "Mean over PyTorch's adaptive windows of NCHW x down to output_size (oh, ow).")
register("adaptive_avg_pool2d_grad", 1, _adaptive_grad_infer,
         lambda a, at, s: _adaptive_grad_reference(a[0], _pair(at, "input_hw")),
         lambda emit, xs, out, g, at: [emit("adaptive_avg_pool2d", g, output_size=tuple(xs[0].shape[2:]))],
         "Backward of adaptive_avg_pool2d: each output's grad shared over its window; input_hw.")


# ---------------------------------------------------------------------------- pad


def _pad_infer(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    pads = tuple(tuple(int(v) for v in p) for p in attrs["pads"])
    if len(pads) != len(x.shape) or any(len(p) != 2 for p in pads):
        raise ShapeError(f"pad: pads {pads} must hold one (before, after) pair per axis of {fmt_shape(x.shape)}")
    shape = []
    for d, (lo, hi) in zip(x.shape, pads):
        if d == BATCH:
            if (lo, hi) != (0, 0):
                raise ShapeError(f"pad: the batch axis of {fmt_shape(x.shape)} cannot be padded, got {(lo, hi)}")
            shape.append(d)
            continue
        if d + min(lo, 0) + min(hi, 0) < 1:
            raise ShapeError(f"pad: pads {pads} crop all of an axis of {fmt_shape(x.shape)}; "
                             "expected at least one element left")
        shape.append(d + lo + hi)
    return TensorType(tuple(shape), x.dtype)


def pad_reference(x: np.ndarray, pads: tuple[tuple[int, int], ...], value: float) -> np.ndarray:
    """Constant padding; negative amounts crop."""
    crop = tuple(slice(max(-lo, 0), d - max(-hi, 0)) for d, (lo, hi) in zip(x.shape, pads))
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    return np.pad(x[crop], grow, constant_values=np.asarray(value, x.dtype))


register("pad", 1, _pad_infer, lambda a, at, s: pad_reference(a[0], at["pads"], at["value"]),
         lambda emit, xs, out, g, at: [emit("pad", g, pads=tuple((-lo, -hi) for lo, hi in at["pads"]), value=0.0)],
         "x padded with value: pads holds (before, after) per axis; negative amounts crop.")
