"""The CUDA path of the sequence-model ops (slices, cat, gathers and their scatter-adds, where,
comparisons, batched products), run by the SIMT interpreter against the reference."""

import numpy as np

import mlir_nn
from mlir_nn.backends.cuda import graph_to_linalg
from mlir_nn.backends.reference import evaluate
from mlir_nn.engine import Tensor
from mlir_nn.gpu.emulate import EmulatedStep
from tests.test_engine_indexing import CASES, X, Y

NAMES = ["steps", "cat", "array_2d", "gather", "where", "matmul_4d_broadcast", "compare"]


def test_sequence_ops_and_gradients_match_the_reference():
    x, y = Tensor(X.astype(np.float32)), Tensor(Y.astype(np.float32))

    def step(rows):
        outs = [CASES[n](mlir_nn, x, y) for n in NAMES] + [x[rows]]
        sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
        result = outs + [x._grad, y._grad]
        x.grad = y.grad = None
        return result

    rows = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    compiled = mlir_nn.jit(step, backend="numpy").lower(rows)
    graph, params = compiled.optimized_graph, [t.data for t in compiled.captured]
    want = [np.asarray(w) for w in evaluate(graph, [rows], [p.copy() for p in params], 2)[0]]
    text, func = graph_to_linalg(graph)
    got = EmulatedStep(text, func, [len(n.shape) for n in graph.outputs]).run([rows] + params,
                                                                              [w.shape for w in want], np.float32)
    assert len(got) == len(want) == len(NAMES) + 3
    for name, g, w in zip(NAMES + ["x[rows]", "x.grad", "y.grad"], got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())), err_msg=name)
