"""Convolution products store their rows straight to NCHW, bias and activation applied in registers:
no pixel-row buffer, no transpose or bias kernel, race-free and equal to the NumPy reference."""

import pytest
from mlir.ir import Context, Module

from mlir_nn.backends.cuda import compile_graph
from mlir_nn.gpu.scatters import find_scatter
from mlir_nn.gpu.simt_check import check_graph
from mlir_nn.ir import Graph, make_node
from tests.codegen.test_windows import _leaf


def _conv_bias(c, hw, o, kernel, stride, padding, dilation, activation):
    x = _leaf("input", "x", ("N", c) + hw, "float32")
    w = _leaf("param", "w", (o, c) + kernel, "float32")
    bias = _leaf("param", "b", (o,), "float32")
    y = make_node("conv2d_bias", [x, w, bias], stride=stride, padding=padding, dilation=dilation, groups=1,
                  activation=activation)
    return Graph((x,), (w, bias), (y,), name="conv_bias")


@pytest.mark.parametrize("spec,batch", [
    ((4, (9, 7), 6, (3, 2), (2, 1), (1, 2, 0, 1), (1, 2), "relu"), 3),
    ((3, (5, 5), 7, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), "none"), 1),
    ((1, (13, 11), 33, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), "relu"), 2),
], ids=["strided_dilated_relu", "batch1_unpadded", "one_channel_33_outputs"])
def test_biased_convolution_is_one_product_kernel(spec, batch):
    graph = _conv_bias(*spec)
    program = compile_graph(graph, (), cubin=False)
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    # the product only: padding and columns read through (gpu.gathers), no transpose, no bias pass
    assert all(k.endswith(("_tile64", "_tile128")) for k in kernels), kernels
    shapes = [r["shape"] for r in program.plan["program"] if r["op"] == "memref.alloc"]
    assert [None, spec[2]] not in shapes, shapes  # no pixel rows (N * P * Q, O)
    result = check_graph(graph, batch, program=program)
    assert result.ok, result.problems


ROWS = """
func.func @f(%a: memref<8x12xf32>, %w: memref<5x12xf32>, %out: memref<2x5x2x2xf32>, %keep: memref<8x5xf32>) {{
  %zero = arith.constant 0.0 : f32
  %c = memref.alloc() : memref<8x5xf32>
  linalg.fill ins(%zero : f32) outs(%c : memref<8x5xf32>)
  linalg.generic {{indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>,
                                    affine_map<(m, n, k) -> (m, n)>],
                   iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%a, %w : memref<8x12xf32>, memref<5x12xf32>) outs(%c : memref<8x5xf32>) {{
    ^bb0(%x: f32, %y: f32, %acc: f32):
      %p = arith.mulf %x, %y : f32
      %s = arith.addf %acc, %p : f32
      linalg.yield %s : f32
  }}
  {between}
  %view = memref.expand_shape %c [[0, 1, 2], [3]] output_shape [2, 2, 2, 5] : memref<8x5xf32> into memref<2x2x2x5xf32>
  linalg.generic {{indexing_maps = [affine_map<(n, o, p, q) -> (n, p, q, o)>, affine_map<(n, o, p, q) -> (n, o, p, q)>],
                   iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%view : memref<2x2x2x5xf32>) outs(%out : memref<2x5x2x2xf32>) {{
    ^bb0(%in: f32, %o: f32):
      linalg.yield %in : f32
  }}
  return
}}
"""


@pytest.mark.parametrize("between,found", [("", True), ("memref.copy %c, %keep : memref<8x5xf32> to memref<8x5xf32>",
                                                         False)], ids=["only_moved", "also_read"])
def test_rows_are_stored_through_the_copy_only_when_nothing_else_reads_them(between, found):
    with Context():
        module = Module.parse(ROWS.format(between=between))
        ops = [o.operation for o in module.body.operations[0].regions[0].blocks[0].operations]
        fill, product = [o for o in ops if o.name.startswith("linalg.")][:2]
        scatter = find_scatter(product.operands[2], product, [fill, product], ops)
        assert (scatter is not None) == found
        if found:
            assert scatter[0].order == [0, 2, 3, 1] and scatter[0].epilogue is None and scatter[1] == []


@pytest.mark.parametrize("subtract,batch", [(True, 3), (False, 1)])
def test_folded_weight_update_is_applied_in_the_product(subtract, batch):
    """conv2d_weight_update: beta * w +- alpha * dW updates the product's result in place, in registers."""
    attrs = dict(stride=(1, 2), padding=(2, 0, 1, 1), dilation=(2, 1), groups=1)
    x = _leaf("input", "x", ("N", 5, 8, 7), "float32")
    g = _leaf("input", "g", ("N", 6, 6, 4), "float32")
    w = _leaf("param", "w", (6, 5, 3, 2), "float32")
    lr = _leaf("param", "lr", (), "float32")
    beta = make_node("const", [], value=0.75, dtype="float32")
    y = make_node("conv2d_weight_update", [x, g, w, lr, beta], kernel=(3, 2), subtract=subtract, **attrs)
    graph = Graph((x, g), (w, lr), (y,), name="conv_update")
    program = compile_graph(graph, (), cubin=False)
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    assert kernels == ["conv_update_k00_conv2d_weight_update_tile64"], kernels
    result = check_graph(graph, batch, program=program)
    assert result.ok, result.problems
