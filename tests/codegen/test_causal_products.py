"""Causal attention's batched products in blocks (``codegen.causal_products``): which blocks each
product gets, and compiled causal attention (forward and gradients) against the NumPy reference
and PyTorch at awkward context lengths, in float32 and float64; non-causal attention keeps its
whole products; a causal softmax compiled ignores whatever lies above the diagonal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn
from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen.causal_products import ABOVE, BELOW, plan, zero_side
from mlir_nn.engine import Tensor
from mlir_nn.ir import Graph, make_node
from mlir_nn.jit.trace import trace_step
from mlir_nn.nn import functional as F
from mlir_nn.optim import SGD
from tests.holder import Holder


def _readers(graph: Graph) -> dict:
    readers: dict = {}
    for node in graph.nodes:
        for i in dict.fromkeys(node.inputs):
            readers.setdefault(i, []).append(node)
    return readers


def _attention_graph(t: int, causal: bool, d: int = 4) -> Graph:
    """A traced step: causal (or plain) attention of (2, 3, t, d) queries, keys and values and
    the gradients of a weighted sum of its output."""
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal((2, 3, t, d))) for _ in range(3))
    holder = Holder([q, k, v])

    def step(w):
        holder.parameters()
        loss = (F.scaled_dot_product_attention(q, k, v, is_causal=causal) * w).sum()
        loss.backward()
        return [loss, q._grad, k._grad, v._grad]

    return trace_step(step, [np.ones((2, 3, t, d))], ["w"], dynamic_batch=False)[0]


def _plans(graph: Graph) -> list:
    readers, results = _readers(graph), set(graph.outputs)
    return [plan(n, readers, results) for n in graph.nodes if n.op == "bmm"]


def test_each_product_of_causal_attention_skips_the_hidden_blocks():
    plans = _plans(_attention_graph(33, causal=True))
    assert len(plans) == 6 and all(p is not None for p in plans)
    by_products = {p.products: p.zeros for p in plans}
    spans = ((0, 16), (16, 32), (32, 33))
    # q k^T and g v^T: column blocks from the diagonal down, zeros above
    assert by_products[tuple(((c[0], 33), c, (0, 4)) for c in spans)] == (((0, 16), (16, 32)), ((0, 32), (32, 33)))
    # p v and ds k: row block r sums k < its end
    assert tuple((r, (0, 4), (0, r[1])) for r in spans) in by_products
    # p^T g: row block r sums k from its start
    assert tuple((r, (0, 4), (r[0], 33)) for r in spans) in by_products
    # q^T ds: column block c sums k from its start
    assert tuple(((0, 4), c, (c[0], 33)) for c in spans) in by_products


def test_known_zeros_follow_scales_and_transposes():
    x = make_node("input", [], name="x", shape=(2, 5, 5), dtype="float64")
    p = make_node("softmax", [x], axis=2, causal=True)
    scaled = make_node("mul", [p, make_node("const", [], value=0.5, dtype="float64")])
    flipped = make_node("transpose", [scaled], perm=(0, 2, 1))
    assert (zero_side(p), zero_side(scaled), zero_side(flipped)) == (ABOVE, ABOVE, BELOW)
    assert zero_side(make_node("softmax", [x], axis=2)) is None
    assert zero_side(make_node("mul", [p, make_node("const", [], value=float("inf"), dtype="float64")])) is None


@pytest.mark.parametrize("t", [7, 64])
def test_plain_attention_and_short_contexts_keep_whole_products(t):
    assert all(p is None for p in _plans(_attention_graph(t, causal=False)))
    assert all(p is None for p in _plans(_attention_graph(16, causal=True)))


def _compiled_attention(batch: int, t: int, s: int, d: int, dtype: str, backend: str) -> list[np.ndarray]:
    """Loss and SGD-updated q, k, v of one step of causal attention."""
    rng = np.random.default_rng(t * 100 + s)
    q = nn.Parameter(rng.standard_normal((batch, 2, t, d)).astype(dtype))
    k, v = (nn.Parameter(rng.standard_normal((batch, 2, s, d)).astype(dtype)) for _ in range(2))
    w = rng.standard_normal((batch, 2, t, d)).astype(dtype)
    opt = SGD([q, k, v], lr=0.1)

    def step(w):
        opt.zero_grad()
        loss = (F.scaled_dot_product_attention(q, k, v, is_causal=True) * w).sum()
        loss.backward()
        opt.step()
        return loss

    loss = mlir_nn.jit(step, backend=backend, dynamic_batch=False, tiered=False)(w)
    return [np.asarray(loss.data)] + [p.data.copy() for p in (q, k, v)]


def _torch_attention(batch: int, t: int, s: int, d: int) -> list[np.ndarray]:
    rng = np.random.default_rng(t * 100 + s)
    q = torch.tensor(rng.standard_normal((batch, 2, t, d)), requires_grad=True)
    k, v = (torch.tensor(rng.standard_normal((batch, 2, s, d)), requires_grad=True) for _ in range(2))
    w = torch.tensor(rng.standard_normal((batch, 2, t, d)))
    loss = (torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * w).sum()
    loss.backward()
    return [loss.detach().numpy()] + [(p - 0.1 * p.grad).detach().numpy() for p in (q, k, v)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("batch, t, s, d", [(1, 1, 1, 4), (2, 7, 7, 3), (1, 17, 17, 16), (2, 33, 33, 16),
                                            (1, 65, 65, 8), (1, 33, 20, 4), (1, 20, 33, 4)])
def test_compiled_causal_attention_matches_the_reference(batch, t, s, d, dtype):
    got = _compiled_attention(batch, t, s, d, dtype, "cpu")
    want = _compiled_attention(batch, t, s, d, dtype, "numpy")
    tol = 1e-5 if dtype == "float32" else 1e-12
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))
    if dtype == "float64":
        for a, b in zip(got, _torch_attention(batch, t, s, d)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 7), (33, 33), (5, 9), (9, 5)])
def test_compiled_causal_softmax_ignores_what_lies_above_the_diagonal(rows, cols, dtype):
    x = make_node("input", [], name="x", shape=(2, rows, cols), dtype=dtype)
    g = make_node("input", [], name="g", shape=(2, rows, cols), dtype=dtype)
    y = make_node("softmax", [x], axis=2, causal=True)
    graph = Graph((x, g), (), (y, make_node("softmax_grad", [y, g], axis=2, causal=True)), name="causal_rows")
    rng = np.random.default_rng(rows * cols)
    above = np.triu(np.ones((rows, cols), bool), 1)
    xs = np.where(above, 1e30, rng.standard_normal((2, rows, cols)) * 4.0).astype(dtype)  # (inputs are finite)
    gs = np.where(above, -1e30, rng.standard_normal((2, rows, cols))).astype(dtype)
    got = CpuBackend().compile(graph).run([xs, gs], [])
    want = [np.asarray(w) for w in evaluate(graph, [xs, gs], [], 2)[0]]
    tol = 2e-6 if dtype == "float32" else 1e-12
    for a, b in zip(got, want):
        assert np.all(a[..., above] == 0.0) and np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
