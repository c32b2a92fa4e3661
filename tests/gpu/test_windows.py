"""The window ops compiled for CUDA and run on the SIMT interpreter: race-free, in bounds,
equal to the NumPy reference."""

import pytest

from mlir_nn.gpu.simt_check import check_graph
from tests.codegen.test_windows import adaptive_and_pad_graph, conv_graph, pool_graph

GRAPHS = {
    "conv_strided_dilated": (lambda: conv_graph("float32", 2, (5, 4), 3, (3, 2), (2, 1), (1, 1, 0, 1), (1, 2), 1), 2),
    "conv_grouped": (lambda: conv_graph("float64", 4, (5, 5), 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2), 1),
    "pooling": (lambda: pool_graph("float32", 2, (5, 6), (3, 2), (2, 1), (1, 1, 1, 1), (1, 1), True, True), 3),
    "adaptive_and_pad": (lambda: adaptive_and_pad_graph("float32", 2, (5, 7), (3, 2)), 2),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_window_ops_are_simt_clean(name):
    build, batch = GRAPHS[name]
    result = check_graph(build(), batch)
    assert result.ok, result.problems
