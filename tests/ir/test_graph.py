"""Graph structure, the printer's stability and the verifier."""

import numpy as np
import pytest

from mlir_nn.ir import Graph, ShapeError, VerifyError, make_node, topo_order, verify
from mlir_nn.jit import trace_step
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step


def trace_mlp(seed: int = 0) -> Graph:
    np.random.seed(seed)
    model = MLP(3, [4, 2])
    opt = SGD(model.parameters(), lr=0.1)

    step = train_step(model, opt)

    x, y = np.ones((5, 3), np.float32), np.ones((5, 2), np.float32)
    return trace_step(step, [x, y], ["x", "y"])[0]


def test_printer_is_stable_and_readable():
    a, b = trace_mlp(0), trace_mlp(1)  # different weights, same structure
    assert str(a) == str(b)
    assert a.fingerprint() == b.fingerprint()
    text = str(a)
    assert text.startswith("graph @step(%x: f32[N, 3], %y: f32[N, 2]) {")
    assert "= matmul(%x, %p0) : f32[N, 4]" in text
    assert "update %p0 <- " in text


@pytest.mark.parametrize("rows, bucket", [(1, 1), (16, 16), (100, 64), (128, 128), (3000, 2048), (10 ** 9, 1 << 16)])
def test_a_dynamic_batch_is_priced_at_a_power_of_two_of_rows(rows, bucket):
    """``with_batch_rows``: the rows rounded down to a power of two (steps traced at batches of one
    bucket share their code), printed in the graph's text, so part of its fingerprint."""
    graph = trace_mlp()
    priced = graph.with_batch_rows(rows)
    assert graph.batch_rows is None and priced.batch_rows == bucket
    assert f"// priced at a batch of {bucket} rows" in str(priced) and "priced at" not in str(graph)
    assert priced.fingerprint() != graph.fingerprint()
    assert priced.fingerprint() == graph.with_batch_rows(bucket).fingerprint()
    assert graph.with_batch_rows(None) is graph


def test_a_static_batch_is_not_priced_at_rows():
    x = make_node("input", (), name="x", shape=(4, 3), dtype="float32")
    graph = Graph((x,), (), (make_node("relu", [x]),))
    assert graph.with_batch_rows(64) is graph


def test_nodes_hash_structurally():
    x = make_node("input", (), name="x", shape=(2, 3), dtype="float32")
    one = make_node("relu", (x,))
    two = make_node("relu", (make_node("input", (), name="x", shape=(2, 3), dtype="float32"),))
    assert one == two and hash(one) == hash(two)
    assert one != make_node("tanh", (x,))


def test_make_node_checks_shapes():
    a = make_node("input", (), name="a", shape=(2, 3), dtype="float32")
    b = make_node("input", (), name="b", shape=(4, 5), dtype="float32")
    with pytest.raises(ShapeError, match=r"matmul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"):
        make_node("matmul", (a, b))


def test_topo_order_handles_deep_graphs():
    x = make_node("input", (), name="x", shape=(1,), dtype="float32")
    node = x
    for _ in range(20000):
        node = make_node("neg", (node,))
    order = topo_order([node])
    assert len(order) == 20001 and order[0] is x and order[-1] is node


def test_verifier_rejects_broken_graphs():
    x = make_node("input", (), name="x", shape=(2,), dtype="float32")
    p = make_node("param", (), name="p", shape=(3,), dtype="float32")
    verify(Graph((x,), (p,), (make_node("relu", (x,)),)))
    with pytest.raises(VerifyError, match="update of p"):
        verify(Graph((x,), (p,), (), (("p", make_node("relu", (x,))),)))
    with pytest.raises(VerifyError, match="not declared"):
        verify(Graph((), (), (make_node("relu", (x,)),)))
    with pytest.raises(VerifyError, match="no parameter"):
        verify(Graph((x,), (), (), (("q", x),)))


def test_graphs_pickle_with_fresh_hashes():
    import pickle

    graph = trace_mlp()
    copy = pickle.loads(pickle.dumps(graph))
    assert copy == graph and str(copy) == str(graph)
    node = graph.nodes[-1]
    clone = pickle.loads(pickle.dumps(node))
    assert clone == node and hash(clone) == hash(node) and {clone: 1}[node] == 1
