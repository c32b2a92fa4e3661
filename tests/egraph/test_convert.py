"""Graph <-> egglog terms: the round trip without rules is the identity."""

import pytest

from mlir_nn.egraph import optimize
from mlir_nn.ir import OPS, register
from mlir_nn.ir.ops import _unary_infer
from tests.egraph.util import assert_same, graph_of, inp, op, par, round_trip, trace_mlp


@pytest.fixture
def softsign_op():
    """An op the rules know nothing about, registered only for the test using it."""
    register("test_softsign", 1, _unary_infer, lambda a, at, s: a[0] / (1 + abs(a[0])), None, "x / (1 + |x|).")
    yield "test_softsign"
    del OPS["test_softsign"]


@pytest.mark.parametrize("extra", [(), ("--optimizer", "adam"), ("--momentum", "0.9", "--weight-decay", "0.1")])
def test_round_trip_without_rules_is_the_identity(extra):
    graph, _, _ = trace_mlp([2, 8, 3], 10, *extra)
    back = round_trip(graph)
    assert back is not graph and back == graph and str(back) == str(graph)
    same, report = optimize(graph, rulesets=[])
    assert same == graph.with_batch_rows(report.batch_estimate) and report.error is None
    assert report.stop_reason == "no rules"


def test_every_op_kind_survives_the_round_trip():
    x, w = inp("x", ("N", 3)), par("w", (3, 4))
    h = op("matmul", x, w)
    t = op("transpose", h, perm=(1, 0))
    s = op("sum", op("pow", op("exp", t), exponent=3.0), axes=(1,), keepdims=True)
    m = op("mean_grad", op("reshape", op("mean", h, axes=(0, 1), keepdims=False), shape=(1, 1)),
           shape=("N", 4), axes=(0, 1))
    out = op("add", op("broadcast_to", s, shape=(4, "N")), op("transpose", m, perm=(1, 0)))
    graph = graph_of([x], [w], [out, op("sum_to", h, shape=(4,))])
    back = round_trip(graph)
    assert back == graph and str(back) == str(graph)


def test_unknown_op_passes_through_unchanged(softsign_op):
    x, w, b = inp("x", ("N", 3)), par("w", (3, 4)), par("b", (4,))
    z = op("add", op("matmul", x, w), b)
    out = op(softsign_op, z)
    graph = graph_of([x], [w, b], [op("relu", op("relu", out))])
    optimized, report = optimize(graph)
    assert report.error is None
    assert optimized.op_counts()["test_softsign"] == 1
    assert "linear" in optimized.op_counts() and optimized.op_counts()["relu"] == 1
    assert_same(graph, optimized)
