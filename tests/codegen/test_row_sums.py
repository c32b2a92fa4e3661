"""Sums over the batch of narrow tensors (bias gradients) as vector code with register totals.

Checked against float64 sums: the float32 reference adds rows one after the other along the
batch (NumPy's pairwise summation is along contiguous memory only), 3e-6 off at 4099 rows,
where the compiled float64 totals are within 1e-7."""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.row_sums import ROW_SUM_MAX, tag_row_sums
from mlir_nn.ir import Graph, make_node

ROWS = (1, 7, 13, 33, 257, 4099)
TOL = {"float32": 2e-7, "float64": 1e-13}  # of the largest total


def _sums(width: int, dtype: str) -> Graph:
    """sum_to over the batch, and the same over a product's output (a bias gradient's shape)."""
    x = make_node("input", [], name="x", shape=("N", width), dtype=dtype)
    scale = make_node("param", [], name="s", shape=(width,), dtype=dtype)
    outs = (make_node("sum_to", [x], shape=(width,)),
            make_node("sum_to", [make_node("mul", [x, scale])], shape=(1, width)))
    return Graph((x,), (scale,), outs, name="row_sums")


@pytest.mark.parametrize("width, dtype", [(1, "float32"), (32, "float32"), (ROW_SUM_MAX, "float32"),
                                          (13, "float64"), (ROW_SUM_MAX + 1, "float32")])
def test_row_sums_are_tagged_and_match_the_reference(width, dtype):
    graph = _sums(width, dtype)
    assert tag_row_sums(emit_linalg(graph, wide_sums=True)) == (2 if width <= ROW_SUM_MAX else 0)
    executable = CpuBackend().compile(graph)
    for rows in ROWS:
        rng = np.random.default_rng(rows)
        x = rng.standard_normal((rows, width)).astype(dtype) + 3.0  # totals far from zero: a relative check
        scale = rng.standard_normal(width).astype(dtype)
        truths = [x.astype(np.float64).sum(0), (x * scale).astype(np.float64).sum(0)]
        for got, truth in zip(executable.run([x], [scale]), truths):
            assert got.dtype == dtype and got.size == width
            error = np.abs(got.ravel() - truth).max() / np.abs(truth).max()
            assert error <= TOL[dtype], f"{rows} rows of {width}: {error:.2g} off"
