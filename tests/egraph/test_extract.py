"""The incremental extractor: as good as the earlier whole-program one, never cyclic."""

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlir_nn.egraph import optimize
from mlir_nn.egraph.convert import EClasses, ENode, read_eclasses
from mlir_nn.egraph.cost import CostModel
from mlir_nn.egraph.driver import node_cost_fn
from mlir_nn.egraph.extract import dag_cost, extract
from mlir_nn.egraph.rules import RULESETS
from tests.egraph import sweep_extract
from tests.egraph.test_random_mlps import OPTIMIZERS
from tests.egraph.util import saturated, trace_mlp


def _enode(name: str, *children: str) -> ENode:
    return ENode(name, (), tuple(children))


def test_a_switch_that_would_close_a_cycle_is_refused():
    # Y's alternative "y_of_x" is free and X already uses Y: choosing it would save 5 but
    # make X -> Y -> X, which is no program.
    costs = {"r": 1.0, "x_of_y": 1.0, "x_leaf": 10.0, "y_of_x": 0.0, "y_leaf": 5.0}
    nodes = {
        "R": [_enode("r", "X")],
        "X": [_enode("x_of_y", "Y"), _enode("x_leaf")],
        "Y": [_enode("y_of_x", "X"), _enode("y_leaf")],
    }
    eclasses = EClasses(nodes, {}, ["R"])
    choice, total = extract(eclasses, lambda cid, enode: costs[enode.op])
    assert {cid: e.op for cid, e in choice.items()} == {"R": "r", "X": "x_of_y", "Y": "y_leaf"}
    assert total == 7.0
    assert dag_cost(["R"], choice, {e: costs[e.op] for e in choice.values()})[0] == 7.0


def test_sharing_is_found_by_the_local_search():
    # As a tree, P's private e-node is cheaper (3 < 1 + 3); as a program, P can use the S
    # that T computes anyway (1 instead of 3).
    costs = {"root": 1.0, "t": 1.0, "s": 3.0, "p_own": 3.0, "p_s": 1.0}
    nodes = {
        "R": [_enode("root", "P", "T")],
        "T": [_enode("t", "S")],
        "S": [_enode("s")],
        "P": [_enode("p_own"), _enode("p_s", "S")],
    }
    choice, total = extract(EClasses(nodes, {}, ["R"]), lambda cid, enode: costs[enode.op])
    assert total == 6.0 and choice["P"].op == "p_s"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(widths=st.lists(st.integers(1, 32), min_size=2, max_size=6), options=st.sampled_from(OPTIMIZERS),
       random_costs=st.booleans(), seed=st.integers(0, 2**16))
def test_extraction_costs_what_the_earlier_extractor_finds(widths, options, random_costs, seed):
    graph, _, _ = trace_mlp(widths, 16, *options)
    egraph, loaded, _ = saturated(graph, list(RULESETS))
    eclasses = read_eclasses(egraph, loaded)
    known = node_cost_fn(eclasses, CostModel(batch=16), 8)
    rng = np.random.default_rng(seed)
    drawn: dict[ENode, float] = {}

    def cost(cid, enode):
        c = known(cid, enode)
        if c is None or not random_costs:
            return c
        return drawn.setdefault(enode, float(rng.uniform(0.0, 10.0)))

    choice, total = extract(eclasses, cost)
    want_choice, want = sweep_extract.extract(eclasses, cost)
    assert math.isfinite(total)
    assert total == dag_cost(eclasses.roots, choice, {e: cost(cid, e) for cid, e in choice.items()})[0]
    # Both are local searches from the best tree; they may settle ties differently, never worse.
    assert total <= want * (1 + 1e-9)
    if not random_costs:
        assert total == want


def test_a_deep_chain_is_optimized_whole():
    """200 layers: every layer's product, bias and ReLU fused (no budget stops halfway)."""
    depth = 200
    graph, _, _ = trace_mlp([4] * (depth + 1), 8)
    optimized, report = optimize(graph, batch_estimate=8)
    assert report.error is None and report.used_optimized and report.stop_reason == "saturated"
    fused = sum(1 for n in optimized.nodes if n.op == "linear" and n.attr("activation") == "relu")
    assert fused == depth - 1  # the last layer has no ReLU
    assert set(report.stage_seconds) == {"load", "saturate", "extract", "verify"}
    assert "stages: load" in str(report)
