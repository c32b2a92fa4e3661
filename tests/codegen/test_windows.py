"""The window ops compiled for the CPU against the NumPy reference, on awkward shapes
(batch 1, one channel, odd sizes, strides and dilations that do not divide, ceil_mode)."""

import re

import numpy as np
import pytest

from mlir_nn.backends import get_backend
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen.windows import CHUNK_PIXELS, TAP_SUMS_MAX, chunk_images
from mlir_nn.ir import Graph, conv_forms, make_node

pytestmark = pytest.mark.usefixtures("planned_for_the_schedule_tests")  # (tests/conftest.py)

TOL = {"float32": dict(rtol=2e-4, atol=2e-5), "float64": dict(rtol=1e-9, atol=1e-11)}


def _leaf(kind, name, shape, dtype):
    return make_node(kind, [], name=name, shape=shape, dtype=dtype)


def conv_graph(dtype, c, hw, o, kernel, stride, padding, dilation, groups):
    x = _leaf("input", "x", ("N", c) + hw, dtype)
    w = _leaf("param", "w", (o, c // groups) + kernel, dtype)
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = make_node("conv2d", [x, w], **attrs)
    g = _leaf("input", "g", y.shape, dtype)
    return Graph((x, g), (w,), (y, make_node("conv2d_input_grad", [g, w], input_hw=hw, **attrs),
                                make_node("conv2d_weight_grad", [x, g], kernel=kernel, **attrs)), name="conv")


def pool_graph(dtype, c, hw, kernel, stride, padding, dilation, ceil_mode, count_include_pad):
    x = _leaf("input", "x", ("N", c) + hw, dtype)
    at = dict(kernel=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    y = make_node("max_pool2d", [x], **at)
    g = _leaf("input", "g", y.shape, dtype)
    index = make_node("max_pool2d_index", [x, y], **at)
    outs = [y, index, make_node("max_pool2d_grad", [g, index], input_hw=hw, **at)]
    if dilation == (1, 1):
        avg = dict(kernel=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                   count_include_pad=count_include_pad)
        outs += [make_node("avg_pool2d", [x], **avg), make_node("avg_pool2d_grad", [g], input_hw=hw, **avg)]
    return Graph((x, g), (), tuple(outs), name="pool")


def adaptive_and_pad_graph(dtype, c, hw, out):
    x = _leaf("input", "x", ("N", c) + hw, dtype)
    y = make_node("adaptive_avg_pool2d", [x], output_size=out)
    g = _leaf("input", "g", y.shape, dtype)
    return Graph((x, g), (), (y, make_node("adaptive_avg_pool2d_grad", [g], input_hw=hw),
                              make_node("pad", [x], pads=((0, 0), (1, -1), (2, 0), (-1, 3)), value=0.5),
                              make_node("pad", [x], pads=((0, 0), (0, 0), (1, 1), (2, 2)), value=0.0)),
                 name="adaptive_pad")


def check(graph, batch, ties=False, seed=0, tol=None):
    rng = np.random.default_rng(seed)
    dtype = graph.inputs[0].dtype
    inputs = []
    for node in graph.inputs:
        v = rng.standard_normal(tuple(batch if d == "N" else d for d in node.shape))
        inputs.append((np.round(v) if ties else v).astype(dtype))  # rounding makes tied maxima
    params = [rng.standard_normal(p.shape).astype(dtype) for p in graph.params]
    want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
    got = get_backend("cpu").compile(graph).run(inputs, params)
    for node, g, w in zip(graph.outputs, got, want):
        assert g.shape == w.shape, node.op
        np.testing.assert_allclose(g, w, **(tol or TOL[dtype]), err_msg=f"{node.op} {dict(node.attrs)}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,batch", [
    ((1, (5, 5), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 1),
    ((4, (7, 6), 6, (3, 2), (2, 1), (1, 1, 0, 0), (1, 2), 2), 3),
    ((3, (9, 8), 5, (2, 2), (1, 1), (0, 1, 0, 1), (1, 1), 1), 2),  # padding="same" with an even kernel
    ((4, (8, 5), 4, (3, 3), (3, 2), (2, 2, 1, 1), (2, 1), 4), 2),  # depthwise
    ((16, (5, 4), 3, (3, 2), (1, 2), (1, 0, 1, 1), (1, 1), 1), 2),  # col2im dX at 16 input channels
    ((64, (7, 9), 5, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 1),  # col2im dX at 64: stride 2, odd image, batch 1
    ((65, (5, 4), 3, (3, 2), (1, 2), (1, 0, 1, 1), (1, 1), 1), 2),  # enough input channels for the im2col dX
    ((5, (11, 10), 7, (3, 2), (2, 3), (2, 1, 0, 2), (2, 1), 1), 3),  # col2im dX: stride, dilation, uneven padding
    ((2, (6, 9), 4, (5, 5), (1, 1), (0, 0, 0, 0), (1, 1), 1), 1),  # col2im dX: LeNet's 5x5 taps, batch 1
])
def test_convolutions(dtype, case, batch):
    check(conv_graph(dtype, *case), batch)


@pytest.mark.parametrize("case", [
    (5, (9, 7), 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),  # col2im input gradient: both read pixel rows
    (65, (5, 4), 3, (3, 2), (1, 2), (1, 0, 1, 1), (1, 1), 1),  # im2col input gradient: only the weight's do
])
def test_weight_and_input_gradients_share_the_output_gradients_pixel_rows(case):
    """The output gradient is transposed into (N * P * Q, O) pixel rows once, whichever gradients read it."""
    graph = conv_graph("float32", *case)
    text = get_backend("cpu").compile(graph).stages["linalg"]
    assert len(re.findall(r"linalg.generic [^\n]*ins\(%arg1 :", text)) == 1  # %arg1: the output gradient
    for batch in (1, 3):
        check(graph, batch, seed=batch)


def test_window_passes_on_threads_at_a_batch_of_several_partial_tasks():
    """At batch 257 the passes over 4-D and 6-D buffers (im2col, transposes, pools, their
    gradients) run on threads in blocks of the batch, the last one partial (parallel_maps)."""
    check(conv_graph("float32", 5, (11, 10), 7, (3, 2), (2, 3), (2, 1, 0, 2), (2, 1), 1), 257)
    check(conv_graph("float32", 16, (5, 4), 3, (3, 2), (1, 2), (1, 0, 1, 1), (1, 1), 1), 257)
    check(pool_graph("float32", 3, (7, 9), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, True), 257, ties=True)


def test_sums_over_the_batch_on_threads_split_over_channels():
    """A few-tap weight gradient and a bias gradient sum over the batch: on threads they split
    over output channels (``parallel_maps._inner_split``), the 7 of the weight gradient one
    per task, those of the bias (its dynamic batch counted as 32) too.
    (Sums of 40 x 31 x 33 products of unit normals, about 200 in size: float32 rounding of
    their partial sums puts single elements 3e-4 off.)"""
    check(conv_graph("float32", 3, (31, 33), 7, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 40,
          tol=dict(rtol=2e-4, atol=2e-3))
    g = _leaf("input", "g", ("N", 7, 31, 33), "float32")
    bias_grad = make_node("sum", [g], axes=(0, 2, 3), keepdims=True)
    check(Graph((g,), (), (bias_grad,), name="bias_grad"), 5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,batch", [
    ((3, (7, 9), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, True), 2),
    ((2, (8, 7), (3, 2), (2, 1), (1, 1, 1, 1), (2, 1), False, True), 1),
    ((1, (6, 5), (2, 2), (2, 2), (1, 1, 1, 1), (1, 1), True, False), 3),
    ((3, (6, 8), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False, True), 2),  # windows that tile the input
    ((2, (6, 6), (3, 2), (3, 2), (0, 0, 0, 0), (1, 1), False, True), 1),
])
def test_pooling_with_tied_maxima(dtype, case, batch):
    check(pool_graph(dtype, *case), batch, ties=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adaptive_pooling_and_pad(dtype):
    check(adaptive_and_pad_graph(dtype, 3, (5, 7), (3, 2)), 2)
    check(adaptive_and_pad_graph(dtype, 2, (2, 4), (3, 2)), 1)



def _tap_sum_loops(all_taps_inside: bool) -> str:
    """The iterators of a few-tap weight gradient's pass: the kh taps inside the row loop or outside it."""
    inner = ["reduction"] + ["parallel"] * 3 + ["reduction"] + ["parallel"] * 3
    outer = ["reduction"] + ["parallel"] * 4 + ["reduction"] + ["parallel"] * 2
    return ", ".join(f'"{k}"' for k in (inner if all_taps_inside else outer))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [20, 37])
def test_few_tap_weight_gradients_keep_the_sums_of_a_rows_taps_in_registers(dtype, width):
    """3 x 3 taps over rows of 20 columns (whole vectors: 32 floats, 2 AVX-512 registers; 3 of
    float64): the 18 sums of a row's taps fit in registers, and every tap is summed inside the row
    loop; over 37 columns (48: 3 registers, 27 sums) the kh taps stay outside it."""
    from mlir_nn.codegen import emit_linalg
    from mlir_nn.support.cpu_target import vector_bytes

    graph = weight_grad_graph(dtype, 3, 3, (7, width), 5, (3, 3), (1, 1), (1, 1, 1, 1))
    text = str(emit_linalg(graph, strided_copies=True))
    lanes = vector_bytes() * 8 // (32 if dtype == "float32" else 64)
    sums = 9 * -(-width // lanes)
    assert f"iterator_types = [{_tap_sum_loops(sums <= TAP_SUMS_MAX)}]" in text
    check(graph, 3)
    check(weight_grad_graph(dtype, 3, 3, (7, width), 5, (3, 3), (1, 1), (1, 1, 1, 1), update=True), 3, seed=1)


@pytest.mark.parametrize("c, kernel, groups, width, taps", [(1, (5, 5), 1, 38, 25), (3, (3, 3), 1, 34, 27),
                                                             (4, (3, 3), 4, 34, 9), (16, (5, 5), 1, 38, None)])
def test_convolutions_with_few_taps_sum_them_in_one_pass(c, kernel, groups, width, taps):
    """A convolution with few taps per output (the tap sum costs least): the forward pass is one pass
    over NCHW, loops (n g o p | c i j | q) reading the padded input (no views), and the weight
    gradient one pass of partial sums per output column; no im2col product. More taps, or
    the CUDA target (no subviews), keep the GEMM or the direct loop. (Rows of 32 outputs fill
    whole vectors, no columns to crop; narrow rows would waste the tap sum's lanes.)"""
    from mlir_nn.codegen import emit_linalg

    at = dict(stride=(2, 1), padding=(1, 1, 2, 0), dilation=(1, 2), groups=groups)
    x = _leaf("input", "x", ("N", c, 9, width), "float32")
    w = _leaf("param", "w", (16, c // groups) + kernel, "float32")
    y = make_node("conv2d", [x, w], **at)
    forward = Graph((x,), (w,), (y,), name="conv")
    g = _leaf("input", "g", y.shape, "float32")
    weights = Graph((x, g), (), (make_node("conv2d_weight_grad", [x, g], kernel=kernel, **at),), name="weights")
    text, wtext = (str(emit_linalg(graph, strided_copies=True)) for graph in (forward, weights))
    if taps is None:
        assert "linalg.matmul" in text and "linalg.matmul" in wtext
    else:
        assert "linalg.matmul" not in text and "tensor.extract_slice" not in text
        # (n g o p | c i j | q): each output row's vectors summed over the taps in registers
        loops = '"parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction", "parallel"'
        assert f"iterator_types = [{loops}]" in text
        assert "linalg.matmul" not in wtext
        # the kw taps' sums run beside the columns, as independent chains: (n | g o c i | p | j q),
        # or all taps' sums of a row (n | g o c | p | i j q) when they fit in registers
        assert f"iterator_types = [{_tap_sum_loops(kernel[0] * kernel[1] <= TAP_SUMS_MAX)}]" in wtext
    assert "tensor.extract_slice" not in str(emit_linalg(forward, strided_copies=False))
    assert "linalg.matmul" in str(emit_linalg(weights, strided_copies=False)) or groups > 1
    check(forward, 5)
    check(weights, 5)


def test_pads_and_spreads_are_slice_copies_only_when_asked():
    """The CPU backend pads and spreads by strided insert_slice (vector copies); CUDA, whose
    runtime has no subviews, keeps the gathers that read by tensor.extract."""
    from mlir_nn.codegen import emit_linalg

    graph = conv_graph("float32", 2, (7, 6), 3, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    copies, gathers = (str(emit_linalg(graph, strided_copies=flag)) for flag in (True, False))
    assert "tensor.insert_slice" in copies and "tensor.insert_slice" not in gathers
    assert copies.count("tensor.extract ") < gathers.count("tensor.extract ")


@pytest.mark.parametrize("stride,padding,dilation", [((1, 1), (0, 0, 0, 0), (1, 1)), ((2, 3), (2, 1, 0, 2), (2, 1)),
                                                     ((3, 2), (1, 1, 2, 2), (1, 3))])
def test_few_channel_input_gradient_equals_pytorch_in_float64(stride, padding, dilation):
    """The col2im input gradient (3 input channels for 5 output channels) against PyTorch's
    conv2d backward, at dynamic batch sizes that differ between calls."""
    torch = pytest.importorskip("torch")
    hw, kernel = (13, 11), (3, 4)
    graph = conv_graph("float64", 3, hw, 5, kernel, stride, padding, dilation, 1)
    step = get_backend("cpu").compile(graph)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 3) + kernel)
    top, bottom, left, right = padding
    for batch in (1, 4, 2):
        x = rng.standard_normal((batch, 3) + hw)
        g = rng.standard_normal((batch,) + tuple(int(d) for d in graph.outputs[0].shape[1:]))
        xt = torch.nn.functional.pad(torch.from_numpy(x), (left, right, top, bottom)).requires_grad_()
        torch.nn.functional.conv2d(xt, torch.from_numpy(w), stride=stride, dilation=dilation).backward(
            torch.from_numpy(g))
        want = xt.grad.numpy()[:, :, top:top + hw[0], left:left + hw[1]]
        _, dx, _ = step.run([x, g], [w])
        np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels,out,stride,col2im", [(16, 24, 2, True), (64, 24, 2, True), (72, 8, 1, False)])
def test_cpu_input_gradients_take_the_form_the_cost_picks(channels, out, stride, col2im):
    """On the CPU an input gradient with few input channels for its output channels, or a stride,
    is the product of the gradient's pixel rows with the weight, its columns added back (no im2col
    gather of the spread gradient); with many input channels for few output channels at stride 1,
    the im2col form (its columns hold O * KH * KW, not KH * KW * C, values per pixel). Both match
    the reference at a static batch of 3 (odd image, uneven padding)."""
    from mlir_nn.codegen import emit_linalg
    from mlir_nn.codegen.im2col_panels import IM2COL

    hw, attrs = (9, 7), dict(stride=(stride, stride), padding=(1, 0, 1, 1), dilation=(1, 1), groups=1)
    w = _leaf("param", "w", (out, channels, 3, 3), "float32")
    y = make_node("conv2d", [_leaf("input", "x", (3, channels) + hw, "float32"), w], **attrs).shape
    g = _leaf("input", "g", y, "float32")
    graph = Graph((g,), (w,), (make_node("conv2d_input_grad", [g, w], input_hw=hw, **attrs),), name="dx")
    assert (IM2COL not in str(emit_linalg(graph, strided_copies=True))) == col2im
    check(graph, 3)


def test_few_channel_input_gradient_adds_taps_in_place_without_a_spread_buffer():
    """col2im on the CPU: one pass over the columns that adds each pixel's row of taps (KW * C
    columns, contiguous) into a contiguous run of the padded image's row; with a dilation along
    W one strided add per kernel tap; no 6-D spread of the columns (the gather's buffer). CUDA
    keeps the gather in float64, and in float32 takes the columns of the spread gradient (read
    in place by its implicit GEMM)."""
    from mlir_nn.codegen import emit_linalg

    x = _leaf("input", "x", ("N", 6, 14, 14), "float32")
    w = _leaf("param", "w", (16, 6, 5, 5), "float32")
    attrs = dict(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)
    g = _leaf("input", "g", ("N", 16, 10, 10), "float32")
    graph = Graph((x, g), (w,), (make_node("conv2d_input_grad", [g, w], input_hw=(14, 14), **attrs),), name="dx")
    cpu, cuda = (str(emit_linalg(graph, strided_copies=flag)) for flag in (True, False))
    assert "(d0, d1 + d3, d2 * 6 + d4)" in cpu and "tensor.insert_slice" not in cpu and "?x18x18x6x5x5" not in cpu
    dilated = dict(attrs, dilation=(1, 2))
    g2 = _leaf("input", "g", ("N", 16, 10, 6), "float32")
    graph2 = Graph((x, g2), (w,), (make_node("conv2d_input_grad", [g2, w], input_hw=(14, 14), **dilated),), name="dx")
    assert str(emit_linalg(graph2, strided_copies=True)).count("tensor.insert_slice") == 25
    assert "?x18x18x6x5x5" not in cuda and "?x14x14x16x5x5" in cuda  # columns of the spread gradient
    x64, w64, g64 = (_leaf(n.op, n.attr("name"), n.shape, "float64") for n in (x, w, g))
    graph64 = Graph((x64, g64), (w64,), (make_node("conv2d_input_grad", [g64, w64], input_hw=(14, 14), **attrs),),
                    name="dx")
    assert "?x18x18x6x5x5" in str(emit_linalg(graph64, strided_copies=False))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("groups,activation", [(1, "relu"), (2, "none"), (2, "relu")])
def test_convolution_with_bias_and_activation(dtype, groups, activation):
    """conv2d_bias (made by the optimizer's conv rules): the product's epilogue adds the bias per
    output channel and applies the activation, im2col (groups 1) and direct (grouped) alike."""
    x = _leaf("input", "x", ("N", 4, 9, 7), dtype)
    w = _leaf("param", "w", (6, 4 // groups, 3, 2), dtype)
    bias = _leaf("param", "b", (6,), dtype)
    y = make_node("conv2d_bias", [x, w, bias], stride=(2, 1), padding=(1, 2, 0, 1), dilation=(1, 2), groups=groups,
                  activation=activation)
    check(Graph((x,), (w, bias), (y,), name="conv_bias"), 3)
    check(Graph((x,), (w, bias), (y,), name="conv_bias"), 1, seed=1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("groups,subtract", [(1, True), (1, False), (2, True)])
def test_weight_gradient_with_a_folded_update(dtype, groups, subtract):
    """conv2d_weight_update (the optimizer's update folded into the weight gradient): beta * w +-
    alpha * dW with a run-time alpha and a constant beta, as the gradient's epilogue."""
    attrs = dict(stride=(1, 2), padding=(2, 0, 1, 1), dilation=(2, 1), groups=groups)
    x = _leaf("input", "x", ("N", 4, 8, 7), dtype)
    g = _leaf("input", "g", ("N", 6, 6, 4), dtype)
    w = _leaf("param", "w", (6, 4 // groups, 3, 2), dtype)
    lr = _leaf("param", "lr", (), dtype)
    beta = make_node("const", [], value=0.75, dtype=dtype)
    y = make_node("conv2d_weight_update", [x, g, w, lr, beta], kernel=(3, 2), subtract=subtract, **attrs)
    check(Graph((x, g), (w, lr), (y,), name="conv_update"), 3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_pooling_over_tiling_windows_reads_strided_views(dtype):
    """2 x 2 windows of stride 2 that tile the input: the pool and its argmax are passes over the
    output reading one strided view per window position (no reduction loop over the windows); the
    argmax and gradient route ties to the first position, as the reference."""
    graph = pool_graph(dtype, 3, (6, 10), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False, True)
    text = get_backend("cpu").compile(graph).stages["linalg"]
    assert text.count("[1, 1, 2, 2] : tensor<?x3x6x10x") == 8
    check(graph, 7, ties=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("c,hw,batch", [(1, (2, 2), 1), (6, (28, 28), 7), (5, (14, 34), 13), (3, (6, 10), 33)])
def test_max_pooling_over_tiling_windows_compares_and_selects_and_keeps_nans(dtype, c, hw, batch):
    """The 2 x 2 pool over tiling windows takes each maximum by compare and select (LLVM vectorizes
    it; ``arith.maximumf`` kept it scalar, 3x slower): NaN at any window position (log of a negative
    input: inputs themselves must be finite), -inf (log 0) and all-negative windows give the
    reference's (NumPy's NaN-propagating) maximum."""
    x = _leaf("input", "x", ("N", c) + hw, dtype)
    graph = Graph((x,), (), (make_node("max_pool2d", [make_node("log", [x])], kernel=(2, 2), stride=(2, 2),
                                       padding=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False),), name="pool")
    compiled = get_backend("cpu").compile(graph)
    assert "maximumf" not in compiled.stages["linalg"]
    v = np.random.default_rng(batch).uniform(0.1, 3.0, (batch, c) + hw).astype(dtype)
    flat = v.reshape(-1)
    flat[::7] = -1.0  # every window position gets some NaNs
    flat[3::11] = 0.0
    v[-1] = np.minimum(v[-1], 0.9)  # the last image: all-negative logarithms (and its NaNs, -infs)
    with np.errstate(divide="ignore", invalid="ignore"):
        want, _ = evaluate(graph, [v], [], batch)
    np.testing.assert_allclose(compiled.run([v], [])[0], want[0], **TOL[dtype])  # NaNs where the reference's


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tap_passes_run_along_output_rows_in_whole_vectors(dtype):
    """LeNet's first layer (one channel, 5 x 5 taps, 28-wide output rows): the forward and weight
    gradient passes over taps compute 32-wide rows of whole vectors (the input padded further, the
    output gradient padded with zeros) and keep the first 28; all match the reference."""
    graph = conv_graph(dtype, 1, (28, 28), 6, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 1)
    text = get_backend("cpu").compile(graph).stages["linalg"]
    element = "f32" if dtype == "float32" else "f64"
    assert f"tensor<?x1x6x28x32x{element}>" in text and f"tensor<1x6x1x5x5x32x{element}>" in text
    check(graph, 3)


def weight_grad_graph(dtype, batch, c, hw, o, kernel, stride, padding, update=False):
    """The weight gradient of a convolution over a static batch (``update``: with an SGD update folded in)."""
    attrs = dict(stride=stride, padding=padding, dilation=(1, 1), groups=1)
    x = _leaf("input", "x", (batch, c) + hw, dtype)
    w = _leaf("param", "w", (o, c) + kernel, dtype)
    g = _leaf("input", "g", make_node("conv2d", [x, w], **attrs).shape, dtype)
    if not update:
        return Graph((x, g), (w,), (make_node("conv2d_weight_grad", [x, g], kernel=kernel, **attrs),), name="dw")
    lr = _leaf("param", "lr", (), dtype)
    beta = make_node("const", [], value=0.75, dtype=dtype)
    y = make_node("conv2d_weight_update", [x, g, w, lr, beta], kernel=kernel, subtract=True, **attrs)
    return Graph((x, g), (w, lr), (y,), name="dw_update")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,chunks", [
    ((7, 5, (35, 39), 6, (3, 3), (2, 2), (1, 1, 1, 1)), 7),  # prime batch: chunks of one image, 7 tasks
    ((2, 4, (50, 47), 4, (3, 3), (1, 1), (0, 0, 0, 0)), 2),  # chunks of one image, 2 tasks
    ((16, 5, (22, 32), 7, (3, 3), (1, 1), (0, 0, 0, 0)), 16),  # 16 chunks: 8 tasks of 2
    ((12, 9, (13, 15), 33, (5, 3), (1, 1), (2, 2, 1, 1)), 3),  # 4 images a chunk; 135 columns, 33 rows
])
def test_weight_gradients_over_a_static_batch_sum_chunks_of_images(dtype, case, chunks, monkeypatch, tmp_path):
    """A weight gradient over more than 2 * CHUNK_PIXELS output pixels of a static batch sums its
    product over chunks of images (their columns gathered per chunk, in cache), in tasks: the
    chunks as ``chunk_images`` counts them, the result as the reference's. (The GEMM form is forced,
    its kernels cached apart: the cost picks the tap sum for most of these few-output products.)"""

    monkeypatch.setenv(conv_forms.FORM_ENV, "gemm")
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    batch, _, hw, _, kernel, stride, padding = case
    out = [(size + lo + hi - k) // s + 1 for size, k, s, lo, hi in zip(hw, kernel, stride, padding[::2], padding[1::2])]
    assert batch // chunk_images(batch, out[0] * out[1]) == chunks
    graph = weight_grad_graph(dtype, *case)
    text = get_backend("cpu").compile(graph).stages["linalg"]
    assert "scf.forall" in text and "scf.for " in text
    # (float32: each sum has up to 9600 terms of size ~1, so its rounding reaches ~1e-4 absolute)
    tol = dict(rtol=2e-4, atol=1e-3) if dtype == "float32" else None
    check(graph, batch, tol=tol)
    check(weight_grad_graph(dtype, *case, update=True), batch, seed=1, tol=tol)


def test_weight_gradients_with_few_pixels_or_a_dynamic_batch_are_one_product():
    """Up to 2 * CHUNK_PIXELS pixels, over one image or a dynamic batch, the weight gradient is one product."""
    assert chunk_images(2, CHUNK_PIXELS) is None and chunk_images("N", 4 * CHUNK_PIXELS) is None
    assert chunk_images(1, 4 * CHUNK_PIXELS) is None
    assert chunk_images(3, CHUNK_PIXELS) == 1 and chunk_images(128, 256) == 4 and chunk_images(128, 64) == 16
    graph = weight_grad_graph("float32", 2, 4, (32, 32), 8, (3, 3), (1, 1), (1, 1, 1, 1))
    assert "scf.for " not in get_backend("cpu").compile(graph).stages["linalg"]
    check(graph, 2)
    one = weight_grad_graph("float32", 1, 5, (50, 47), 4, (3, 3), (1, 1), (1, 0, 2, 1))
    assert "scf.for " not in get_backend("cpu").compile(one).stages["linalg"]
    check(one, 1)


def input_grad_graph(dtype, batch, c, hw, o, kernel, stride, padding, dilation):
    """The input gradient of a convolution over a static batch."""
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=1)
    x = _leaf("input", "x", (batch, c) + hw, dtype)
    w = _leaf("param", "w", (o, c) + kernel, dtype)
    g = _leaf("input", "g", make_node("conv2d", [x, w], **attrs).shape, dtype)
    return Graph((g,), (w,), (make_node("conv2d_input_grad", [g, w], input_hw=hw, **attrs),), name="dx")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,chunks", [
    ((7, 5, (35, 39), 6, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)), 7),  # prime batch, stride 2: 7 tasks of one image
    ((16, 3, (22, 32), 7, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)), 16),  # 16 chunks: 8 tasks of 2
    ((12, 9, (13, 15), 33, (5, 3), (1, 1), (2, 2, 1, 1), (1, 1)), 3),  # 4 images a chunk, uneven padding
    ((6, 4, (33, 41), 5, (3, 2), (1, 2), (1, 1, 0, 1), (1, 2)), 6),  # dilation along W: per-tap adds
])
def test_col2im_input_gradients_over_a_static_batch_run_in_chunks_of_images(dtype, case, chunks):
    """A col2im input gradient over more than 2 * CHUNK_PIXELS output pixels of a static batch runs per
    chunk of images (product, then its columns added into its images), in tasks; as the reference."""
    graph = input_grad_graph(dtype, *case)
    g_shape = graph.inputs[0].shape
    assert case[0] // chunk_images(case[0], g_shape[2] * g_shape[3]) == chunks
    text = get_backend("cpu").compile(graph).stages["linalg"]
    assert "scf.forall" in text and "scf.for " in text
    check(graph, case[0])
    one = input_grad_graph(dtype, 1, *case[1:])  # one image: one product
    assert "scf.for " not in get_backend("cpu").compile(one).stages["linalg"]
    check(one, 1)


NHWC_CASES = [  # batch, channels, image, out channels, kernel, stride, padding, groups
    (1, 1, (13, 13), 3, (5, 5), (1, 1), (0, 0, 0, 0), 1),
    (7, 3, (5, 7), 5, (3, 3), (2, 2), (1, 1, 1, 1), 1),
    (7, 5, (13, 13), 5, (3, 3), (1, 1), (1, 1, 1, 1), 5),  # depthwise
    (2, 4, (7, 6), 6, (3, 2), (2, 1), (1, 2, 0, 1), 2),
]


def nhwc_graph(dtype, c, hw, o, kernel, stride, padding, groups, batch="N"):
    """The window ops and their gradients in NHWC over NHWC inputs."""
    x = _leaf("input", "x", (batch,) + hw + (c,), dtype)
    w = _leaf("param", "w", (o, c // groups) + kernel, dtype)
    bias = _leaf("param", "b", (o,), dtype)
    attrs = dict(stride=stride, padding=padding, dilation=(1, 1), groups=groups, layout="NHWC")
    y = make_node("conv2d", [x, w], **attrs)
    g = _leaf("input", "g", y.shape, dtype)
    lr = _leaf("param", "lr", (), dtype)
    grads = (make_node("conv2d_input_grad", [g, w], input_hw=hw, **attrs),
             make_node("conv2d_weight_grad", [x, g], kernel=kernel, **attrs),
             make_node("conv2d_weight_update", [x, g, w, lr, make_node("const", [], value=0.75, dtype=dtype)],
                       kernel=kernel, subtract=True, **attrs))
    pool = dict(kernel=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False, layout="NHWC")
    odd = dict(pool, kernel=(3, 2), stride=(2, 1), padding=(1, 1, 0, 1))
    avg = dict(kernel=(3, 2), stride=(2, 1), padding=(1, 1, 0, 1), ceil_mode=True, count_include_pad=False,
               layout="NHWC")
    outs = (y, make_node("conv2d_bias", [x, w, bias], activation="relu", **attrs), *grads)
    for at in (odd, pool) if hw[0] % 2 == 0 and hw[1] % 2 == 0 else (odd,):
        pooled = make_node("max_pool2d", [x], **at)
        index = make_node("max_pool2d_index", [x, pooled], **at)
        outs += (pooled, index, make_node("max_pool2d_grad", [op_like(pooled, "gp"), index], input_hw=hw, **at))
    averaged = make_node("avg_pool2d", [x], **avg)
    outs += (averaged, make_node("avg_pool2d_grad", [op_like(averaged, "ga")], input_hw=hw, **avg))
    inputs = (x, g) + tuple(n for n in _leaves(outs) if n.op == "input" and n.attr("name") in ("gp", "ga"))
    return Graph(inputs, (w, bias, lr), outs, name="nhwc")


def op_like(node, name):
    """An input of ``node``'s shape and dtype (a gradient for it)."""
    return _leaf("input", name, node.shape, node.dtype)


def _leaves(outs):
    seen = {}
    for out in outs:
        for i in out.inputs:
            seen.setdefault(i, None)
    return list(seen)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("form", ["gemm", "taps", "col2im"])
@pytest.mark.parametrize("case", NHWC_CASES)
def test_nhwc_window_ops_equal_the_reference(dtype, form, case, monkeypatch):
    """The NHWC forms of the convolutions, pools and their gradients (the layout rules' ops) in
    every form, against the reference (the NCHW op between transposes), at odd sizes and batch 1."""
    monkeypatch.setenv(conv_forms.FORM_ENV, form)
    batch, *shape = case
    check(nhwc_graph(dtype, *shape), batch, ties=True)
    check(nhwc_graph(dtype, *shape), batch, seed=1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nhwc_gradients_over_a_static_batch_run_in_chunks(dtype, monkeypatch):
    """The NHWC weight and col2im input gradients over enough pixels of a static batch to run per
    chunk of images, each chunk's slice of the NHWC image read in place."""
    monkeypatch.setenv(conv_forms.FORM_ENV, "gemm")
    graph = nhwc_graph(dtype, 5, (33, 31), 6, (3, 3), (1, 1), (1, 1, 1, 1), 1, batch=3)
    assert chunk_images(3, 33 * 31) == 1
    tol = dict(rtol=2e-4, atol=1e-3) if dtype == "float32" else None  # sums of 3000 products of about 100
    check(graph, 3, tol=tol)
    monkeypatch.setenv(conv_forms.FORM_ENV, "col2im")
    check(graph, 3, seed=2, tol=tol)


def test_nhwc_gemm_convolution_and_tiling_pool_move_no_image_to_nchw():
    """An NHWC GEMM convolution's product rows are its result and its im2col reads the NHWC image:
    no NCHW tensor of its input or output is made; the tiling max pool reads strided NHWC views."""
    x = _leaf("input", "x", ("N", 12, 12, 8), "float32")
    w = _leaf("param", "w", (16, 8, 3, 3), "float32")
    y = make_node("conv2d", [x, w], stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, layout="NHWC")
    z = make_node("max_pool2d", [y], kernel=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0), dilation=(1, 1),
                  ceil_mode=False, layout="NHWC")
    graph = Graph((x,), (w,), (z,), name="nhwc_gemm")
    assert conv_forms.conv_form("conv2d", conv_forms.conv_shape("conv2d", [x.shape, w.shape], y.shape, y.attr_dict,
                                                                64, 4), "NHWC") == "gemm"
    text = get_backend("cpu").compile(graph).stages["linalg"]
    assert "x8x12x12xf32>" not in text and "x16x10x10xf32>" not in text
    assert text.count("[1, 2, 2, 1] : tensor<?x10x10x16xf32>") == 4
    check(graph, 3)
