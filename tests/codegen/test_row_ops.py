"""The row ops' lowerings (``codegen.row_ops``) compiled for the CPU against the NumPy reference:
softmax with masked (-inf) entries, LayerNorm, and both gradients, at awkward row counts,
in float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.backends.reference import evaluate
from mlir_nn.ir import Graph, make_node

ROWS = (1, 7, 13, 33, 257)
TOL = {"float32": 2e-6, "float64": 1e-12}


def _graph(width: int, dtype: str) -> Graph:
    """softmax over the last axis of x with the masked entries at -inf, softmax over the batch
    axis, LayerNorm of x, and the gradients of both from g."""
    x = make_node("input", [], name="x", shape=("N", width), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", width), dtype=dtype)
    mask = make_node("param", [], name="mask", shape=(width,), dtype=dtype)
    masked = make_node("where", [mask, make_node("const", [], value=float("-inf"), dtype=dtype), x])
    y = make_node("softmax", [masked], axis=1)
    outs = (y, make_node("softmax_grad", [y, g], axis=1), make_node("softmax", [x], axis=0),
            make_node("layer_norm", [x], eps=1e-5), make_node("layer_norm_grad", [x, g], eps=1e-5))
    return Graph((x, g), (mask,), outs, name="row_ops")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [1, 7, 64, 257])
def test_row_ops_match_the_reference(width, dtype):
    graph = _graph(width, dtype)
    executable = CpuBackend().compile(graph)
    mask = (np.arange(width) % 3 == 2).astype(dtype)  # every third column hidden; never a whole row
    for rows in ROWS:
        rng = np.random.default_rng(rows)
        x = (rng.standard_normal((rows, width)) * 4.0 + 1.0).astype(dtype)
        g = rng.standard_normal((rows, width)).astype(dtype)
        want = [np.asarray(w) for w in evaluate(graph, [x, g], [mask], rows)[0]]
        got = executable.run([x, g], [mask])
        for i, (a, w) in enumerate(zip(got, want)):
            scale = max(1.0, float(np.abs(w).max()))
            np.testing.assert_allclose(a, w, rtol=TOL[dtype], atol=TOL[dtype] * scale,
                                       err_msg=f"output {i}, {rows} rows")
        assert np.all(got[0][:, mask == 1] == 0.0)
