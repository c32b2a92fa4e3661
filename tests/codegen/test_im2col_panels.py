"""Convolution products whose A panels are gathered straight from the image (implicit GEMM
packing, ``codegen.im2col_panels``): compiled against the NumPy reference at awkward shapes,
and taken exactly where the output rows split into whole panels."""

import math

import pytest
from mlir import ir

from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
from mlir_nn.codegen.im2col_panels import IM2COL, panel_rows
from mlir_nn.codegen.shaped import indexing_maps
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.codegen.windows import chunk_images
from mlir_nn.ir import Graph, conv_forms, make_node
from mlir_nn.support.cpu_target import register_block
from tests.codegen.test_windows import _leaf, check, conv_graph

pytestmark = pytest.mark.usefixtures("planned_for_the_schedule_tests")  # (tests/conftest.py)


@pytest.mark.parametrize("q,tm,rows", [(16, 12, 8), (8, 12, 8), (10, 12, 10), (7, 12, 7), (24, 12, 12), (36, 12, 12),
                                       (13, 12, None), (5, 12, None), (1, 12, None), (16, 6, 4), (9, 6, 3)])
def test_panel_rows_divide_the_output_row_and_fill_half_a_block_at_least(q, tm, rows):
    assert panel_rows(q, tm) == rows


# (in channels, image, out channels, kernel, stride, padding (top, bottom, left, right), dilation, groups): 72
# channels in (the input gradient is made to take the im2col form: ``gemm_forms``) and 32 or 33
# out, so that the forward and the input gradient are blocked products that are not swapped
CASES = [
    ((72, (3, 16), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 1, 2),  # rows of 16 pixels: panels of 8, batch 1
    ((72, (9, 20), 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 3, 2),  # stride 2: forward rows of 10
    ((72, (11, 14), 33, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1), 2, 2),  # dilation: rows of 14, panels of 7
    ((72, (13, 9), 32, (3, 2), (1, 1), (1, 0, 0, 1), (1, 1), 1), 3, 2),  # uneven padding, rows of 9
    ((72, (5, 13), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 2, 0),  # rows of 13: the packing copies columns
]


def _panel_gathers(graph) -> int:
    module = emit_linalg(graph, strided_copies=True)
    rewrite_matmuls(module, threads=False)
    generics = collect_ops(module, lambda op: op.name == "linalg.generic")
    # the columns a weight gradient still reads lose the tag, which would keep them off threads
    assert not [op for op in generics if IM2COL in op.attributes]
    return sum(1 for op in generics if len(op.operands) == 2 and indexing_maps(op)[0].n_dims == 7)


@pytest.fixture
def gemm_forms(monkeypatch, tmp_path):
    """Every convolution in the im2col + GEMM form (the cost picks col2im for some of CASES' input
    gradients), its kernels cached apart (the cache keys on the graph, not on the form)."""
    monkeypatch.setenv(conv_forms.FORM_ENV, "gemm")
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("case,batch,gathers", CASES)
def test_products_gather_their_panels_where_output_rows_split_into_them(case, batch, gathers, gemm_forms):
    assert _panel_gathers(conv_graph("float32", *case)) == gathers


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,batch,gathers", CASES)
def test_convolutions_with_gathered_panels_match_the_reference(dtype, case, batch, gathers, gemm_forms):
    check(conv_graph(dtype, *case), batch)


def _pixel_gathers(graph) -> int:
    """Gathers of a convolution's columns pixel-major (c, kh, kw, n, p, q): the image's batch
    index is loop 3."""
    module = emit_linalg(graph, strided_copies=True)
    rewrite_matmuls(module, threads=False)
    return len(collect_ops(module, lambda op: op.name == "linalg.generic" and len(op.operands) == 2
                           and indexing_maps(op)[0].n_dims == 6 and str(indexing_maps(op)[0].results[0]) == "d3"))


def _static_conv_graph(dtype, batch, c, hw, o, kernel, stride, padding):
    graph = conv_graph(dtype, c, hw, o, kernel, stride, padding, (1, 1), 1)
    x, g = (_leaf(node.op, node.attr("name"), (batch,) + tuple(node.shape[1:]), dtype) for node in graph.inputs)
    attrs = dict(stride=stride, padding=padding, dilation=(1, 1), groups=1)
    y = make_node("conv2d", [x, graph.params[0]], **attrs)
    return Graph((x, g), graph.params, (y, make_node("conv2d_weight_grad", [x, g], kernel=kernel, **attrs)),
                 name="conv")


# (batch, in channels, image, out channels, kernel, stride, padding): few output channels, so that the
# forward product runs swapped and reads the columns as its B panels
SWAPPED = [
    (32, 6, (14, 14), 8, (5, 5), (1, 1), (0, 0, 0, 0)),  # LeNet-5's second convolution's shape: 3200 pixels
    (40, 5, (15, 17), 7, (3, 3), (2, 2), (1, 1, 1, 0)),  # stride 2, uneven padding: 40 x 8 x 8 pixels
    (33, 6, (14, 14), 8, (5, 5), (1, 1), (0, 0, 0, 0)),  # 3300 pixels, no multiple of the panel: packed
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", SWAPPED)
def test_swapped_products_read_the_columns_gathered_pixel_major(dtype, case):
    """C^T = W @ columns^T: B's column panels are 32 (float64: 16) consecutive pixels of every
    column, which a pixel-major gather from the image lays out whole; the product reads them
    there (before, the columns were transposed into panels: longer than the product).
    Matches the reference, also where the pixels fill no whole panel (the packing).
    (The weight gradient sums 3300 x 150 float32 products of unit normals, about 700 in size:
    elements near zero are up to 1e-4 off.)"""
    graph = _static_conv_graph(dtype, *case)
    lanes = register_block(8 if dtype == "float64" else 4)[1]
    batch = case[0]
    pixels = math.prod(graph.outputs[0].shape) // graph.outputs[0].shape[1]
    assert _pixel_gathers(graph) == (1 if pixels % lanes == 0 else 0), pixels
    check(graph, batch, tol=dict(rtol=2e-4, atol=2e-3) if dtype == "float32" else None)


def _padded_gathers(graph) -> list[tuple[int, ...]]:
    """Output shapes of the gathers that write a convolution's columns into rows padded to whole
    column panels (an expand of a slice of the padded rows, materialized in place)."""
    module = emit_linalg(graph, strided_copies=True)
    rewrite_matmuls(module, threads=False)
    placed = collect_ops(module, lambda op: op.name == "bufferization.materialize_in_destination")
    return [tuple(ir.RankedTensorType(op.operands[1].type).shape) for op in placed]


# (batch, in channels, image, out channels, kernel, stride, padding): weight gradients whose B is the columns
PADDED = [
    (32, 6, (14, 14), 16, (5, 5), (1, 1), (0, 0, 0, 0)),  # LeNet-5's second convolution: 150 columns, 5 panels
    (1, 32, (64, 64), 40, (3, 3), (2, 2), (1, 0, 1, 1)),  # batch 1, stride 2, uneven padding: 288 columns
    (7, 8, (33, 31), 33, (3, 2), (1, 1), (1, 1, 0, 0)),  # 48 columns: float32 panels of 32 and 16 + 16 zeros
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", PADDED)
def test_weight_gradients_read_the_columns_in_rows_padded_to_whole_panels(dtype, case):
    """dW = G^T @ columns (k the pixels): B's column panels are runs of tn columns of each
    pixel's row, which the gather writes into rows padded to whole panels (zeros after the
    columns); the product reads them there, with no packing (before, packing the columns took
    longer than the product); over many pixels, per chunk of images (``chunk_images``). Matches the
    reference."""
    batch, c, _, _, kernel, _, _ = case
    graph = _static_conv_graph(dtype, *case)
    out = graph.outputs[0].shape
    images = chunk_images(batch, out[2] * out[3]) or batch
    assert _padded_gathers(graph) == [(images, out[2], out[3], c) + kernel]
    check(graph, batch, tol=dict(rtol=2e-4, atol=2e-3) if dtype == "float32" else None)
