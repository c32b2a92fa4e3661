"""Convolution products whose A panels are gathered straight from the image (implicit GEMM
packing, ``codegen.im2col_panels``): compiled against the NumPy reference at awkward shapes,
and taken exactly where the output rows split into whole panels."""

import pytest

from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
from mlir_nn.codegen.im2col_panels import IM2COL, panel_rows
from mlir_nn.codegen.shaped import indexing_maps
from mlir_nn.codegen.walk import collect_ops
from tests.codegen.test_windows import check, conv_graph


@pytest.mark.parametrize("q,tm,rows", [(16, 12, 8), (8, 12, 8), (10, 12, 10), (7, 12, 7), (24, 12, 12), (36, 12, 12),
                                       (13, 12, None), (5, 12, None), (1, 12, None), (16, 6, 4), (9, 6, 3)])
def test_panel_rows_divide_the_output_row_and_fill_half_a_block_at_least(q, tm, rows):
    assert panel_rows(q, tm) == rows


# (in channels, image, out channels, kernel, stride, padding (top, bottom, left, right), dilation, groups): 32
# channels both ways, so that the forward and the input gradient are blocked products that are not swapped
CASES = [
    ((32, (3, 16), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 1, 2),  # rows of 16 pixels: panels of 8, batch 1
    ((32, (9, 20), 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1), 3, 2),  # stride 2: forward rows of 10
    ((32, (11, 14), 33, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1), 2, 2),  # dilation: rows of 14, panels of 7
    ((32, (13, 9), 32, (3, 2), (1, 1), (1, 0, 0, 1), (1, 1), 1), 3, 2),  # uneven padding, rows of 9
    ((32, (5, 13), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1), 2, 0),  # rows of 13: the packing copies columns
]


def _panel_gathers(graph) -> int:
    module = emit_linalg(graph, strided_copies=True)
    rewrite_matmuls(module, threads=False)
    generics = collect_ops(module, lambda op: op.name == "linalg.generic")
    # the columns a weight gradient still reads lose the tag, which would keep them off threads
    assert not [op for op in generics if IM2COL in op.attributes]
    return sum(1 for op in generics if len(op.operands) == 2 and indexing_maps(op)[0].n_dims == 7)


@pytest.mark.parametrize("case,batch,gathers", CASES)
def test_products_gather_their_panels_where_output_rows_split_into_them(case, batch, gathers):
    assert _panel_gathers(conv_graph("float32", *case)) == gathers


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case,batch,gathers", CASES)
def test_convolutions_with_gathered_panels_match_the_reference(dtype, case, batch, gathers):
    check(conv_graph(dtype, *case), batch)
