"""Implicit-GEMM convolutions: the register-tiled products read the im2col columns and the pixel
rows through the window indexing (no gathered buffer), race-free and equal to the NumPy reference."""

import subprocess

import pytest
from mlir.ir import Context, Module

from mlir_nn.backends.cuda import compile_graph
from mlir_nn.gpu.gathers import find_gather
from mlir_nn.gpu.simt_check import check_graph
from tests.codegen.test_windows import conv_graph
from tests.gpu.conftest import PTXAS

# (channels, input hw, out channels, kernel, stride, padding (top, bottom, left, right), dilation, batch)
CONVS = {
    "batch1_odd_stride2_padded": (3, (7, 5), 5, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    "wide_input_dilated": (17, (9, 6), 7, (2, 3), (1, 2), (0, 1, 2, 0), (2, 1), 3),
    "pointwise_33_outputs": (16, (6, 7), 33, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),
    "one_channel_5x5": (1, (13, 13), 6, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 2),
}


def _graph(spec):
    c, hw, o, kernel, stride, padding, dilation, _ = spec
    return conv_graph("float32", c, hw, o, kernel, stride, padding, dilation, 1)


def _alloc_shapes(program):
    return [r["shape"] for r in program.plan["program"] if r["op"] == "memref.alloc"]


@pytest.mark.parametrize("name", list(CONVS))
def test_convolutions_read_through_the_window(name):
    spec = CONVS[name]
    graph = _graph(spec)
    conv = graph.outputs[0]
    program = compile_graph(graph, (), cubin=False)
    shapes = _alloc_shapes(program)
    c, (h, w), o, (kh, kw) = spec[:4]
    p, q = (int(d) for d in conv.shape[2:])
    assert [None, p, q, c, kh, kw] not in shapes, shapes  # no im2col columns of the input
    assert [None, h, w, o, kh, kw] not in shapes, shapes  # nor of the spread output gradient
    assert [None, p, q, o] not in shapes, shapes  # no pixel rows of the output gradient
    top, bottom, left, right = spec[5]
    if top + bottom + left + right:
        assert [None, c, h + top + bottom, w + left + right] not in shapes, shapes  # nor a padded input
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    for op in ("conv2d", "conv2d_input_grad", "conv2d_weight_grad"):
        assert any(k.endswith(f"_{op}_tile64") for k in kernels), kernels
    result = check_graph(graph, spec[-1], program=program)
    assert result.ok, result.problems


def test_grouped_convolutions_stay_direct_and_clean():
    result = check_graph(conv_graph("float32", 6, (5, 6), 4, (3, 2), (2, 1), (1, 0, 1, 1), (1, 2), 2), 2)
    assert result.ok, result.problems


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found (CUDA toolkit not installed)")
def test_ptxas_compiles_the_implicit_gemm_kernels(tmp_path):
    program = compile_graph(_graph(CONVS["wide_input_dilated"]), ("sm_90",), cubin=False)
    for name, text in program.ptx["sm_90"].items():
        ptx = tmp_path / f"{name}.ptx"
        ptx.write_text(text)
        proc = subprocess.run([PTXAS, "-arch=sm_90", str(ptx), "-o", str(tmp_path / f"{name}.cubin")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


COLUMNS = """
func.func @f(%x: memref<2x3x4x4xf32>, %w: memref<5x12xf32>, %c: memref<8x5xf32>) {{
  %zero = arith.constant 0.0 : f32
  %cols = memref.alloc() : memref<2x2x2x3x2x2xf32>
  linalg.generic {{indexing_maps = [affine_map<(a, b, c, d, e, f) -> (a, d, b * 2 + e, c * 2 + f)>,
                                    affine_map<(a, b, c, d, e, f) -> (a, b, c, d, e, f)>],
                   iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]}}
      ins(%x : memref<2x3x4x4xf32>) outs(%cols : memref<2x2x2x3x2x2xf32>) {{
    ^bb0(%in: f32, %out: f32):
      linalg.yield %in : f32
  }}
  {between}
  %view = memref.collapse_shape %cols [[0, 1, 2], [3, 4, 5]] : memref<2x2x2x3x2x2xf32> into memref<8x12xf32>
  linalg.generic {{indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>,
                                    affine_map<(m, n, k) -> (m, n)>],
                   iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%view, %w : memref<8x12xf32>, memref<5x12xf32>) outs(%c : memref<8x5xf32>) {{
    ^bb0(%a: f32, %b: f32, %acc: f32):
      %p = arith.mulf %a, %b : f32
      %s = arith.addf %acc, %p : f32
      linalg.yield %s : f32
  }}
  return
}}
"""


@pytest.mark.parametrize("between,found", [("", True), ("linalg.fill ins(%zero : f32) outs(%x : memref<2x3x4x4xf32>)",
                                                         False)], ids=["untouched", "image_overwritten"])
def test_a_gather_is_read_through_only_while_its_image_is_unchanged(between, found):
    with Context():
        module = Module.parse(COLUMNS.format(between=between))
        ops = [o.operation for o in module.body.operations[0].regions[0].blocks[0].operations]
        product = [o for o in ops if o.name == "linalg.generic"][-1]
        gather = find_gather(product.operands[0], product, ops)
        assert (gather is not None) == found
        assert find_gather(product.operands[1], product, ops) is None  # the weight is no gather
        if found:
            assert gather.groups == [[0, 1, 2], [3, 4, 5]]
            assert [s.producer for s in gather.sources] == [o for o in ops if o.name == "linalg.generic"][:1]



def test_static_batch_convolution_with_bias_and_gradients_is_three_kernels():
    """A static batch of 3: the biased, ReLU'd convolution and both gradients, one product kernel each."""
    from mlir_nn.ir import Graph, make_node
    from tests.codegen.test_windows import _leaf

    x = _leaf("input", "x", (3, 17, 9, 6), "float32")
    w = _leaf("param", "w", (7, 17, 2, 3), "float32")
    b = _leaf("param", "b", (7,), "float32")
    attrs = dict(stride=(1, 2), padding=(0, 1, 2, 0), dilation=(2, 1), groups=1)
    y = make_node("conv2d_bias", [x, w, b], activation="relu", **attrs)
    g = _leaf("input", "g", y.shape, "float32")
    outputs = (y, make_node("conv2d_input_grad", [g, w], input_hw=(9, 6), **attrs),
               make_node("conv2d_weight_grad", [x, g], kernel=(2, 3), **attrs))
    graph = Graph((x, g), (w, b), outputs, name="static")
    program = compile_graph(graph, (), cubin=False)
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    assert kernels == ["static_k00_conv2d_bias_tile64", "static_k01_conv2d_input_grad_tile64",
                       "static_k02_conv2d_weight_grad_tile64"], kernels
    result = check_graph(graph, 3, program=program)
    assert result.ok, result.problems


def test_a_weight_gradient_gathering_through_the_forward_convolutions_copy():
    """Unoptimized conv + ReLU step: the weight gradient's pixel rows gather the ReLU gradient,
    which reads the forward convolution's NCHW copy of its product; the forward product's rewrite
    erases that copy, so the weight gradient's gather is found on the rewritten block (it used to
    evaluate the erased copy: a crash in the compiler)."""
    import numpy as np

    from mlir_nn import nn
    from mlir_nn.jit import trace_step
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    np.random.seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 7, 2))
    step = train_step(model, SGD(model.parameters(), lr=0.1))
    x, y = np.zeros((3, 2, 5, 7), np.float32), np.zeros((3, 2), np.float32)
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    program = compile_graph(graph, (), cubin=False)
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    assert any("conv2d_weight_grad_tile" in k for k in kernels), kernels
    result = check_graph(graph, 3, program=program)
    assert result.ok, result.problems
