"""Random MLP training steps: the optimized step computes what the traced one does."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlir_nn.egraph import optimize
from mlir_nn.ir import verify
from tests.egraph.util import assert_same, trace_mlp

OPTIMIZERS = [
    ("--optimizer", "sgd"),
    ("--optimizer", "sgd", "--weight-decay", "0.01"),
    ("--optimizer", "sgd", "--momentum", "0.9"),
    ("--optimizer", "sgd", "--momentum", "0.9", "--weight-decay", "0.1"),
    ("--optimizer", "adam"),
    ("--optimizer", "adam", "--weight-decay", "0.01"),
]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.integers(1, 64), min_size=2, max_size=5), batch=st.integers(1, 128),
       options=st.sampled_from(OPTIMIZERS), lr=st.sampled_from(["0.005", "0.1"]))
def test_optimized_random_mlp_step_matches(widths, batch, options, lr):
    graph, _, _ = trace_mlp(widths, batch, *options, "--lr", lr)
    optimized, report = optimize(graph, batch_estimate=batch)
    assert report.error is None, report.error
    verify(optimized)
    assert report.cost_after <= report.cost_before
    assert "transpose" not in optimized.op_counts()
    assert_same(graph, optimized, batch=batch, seed=batch)
    if len(widths) > 2 and report.used_optimized:
        assert any(n.op == "linear" and n.attr("activation") == "relu" for n in optimized.nodes)
