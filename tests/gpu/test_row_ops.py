"""The row ops (softmax with masked entries, LayerNorm, both gradients) on the CUDA path, run by
the emulation of its scheduled IR against the reference at awkward batch sizes."""

import numpy as np

from mlir_nn.backends.reference import evaluate
from tests.codegen.test_row_ops import _graph
from tests.gpu.test_emulate import emulated


def test_row_ops_emulated_match_the_reference():
    graph = _graph(13, "float32")
    step = emulated(graph)
    mask = (np.arange(13) % 3 == 2).astype(np.float32)
    for rows in (1, 7, 33):
        rng = np.random.default_rng(rows)
        x = (rng.standard_normal((rows, 13)) * 4.0 + 1.0).astype(np.float32)
        g = rng.standard_normal((rows, 13)).astype(np.float32)
        want = [np.asarray(w) for w in evaluate(graph, [x, g], [mask], rows)[0]]
        got = step.run([x, g, mask], [w.shape for w in want], np.float32)
        for i, (a, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=2e-6 * max(1.0, float(np.abs(w).max())),
                                       err_msg=f"output {i}, {rows} rows")
