"""Saturation limits, failures and the report."""

import pytest
from egglog import rewrite

from mlir_nn.egraph import Limits, optimize
from mlir_nn.egraph import rules as rules_pkg
from mlir_nn.egraph.rules.common import P2, build, x
from mlir_nn.egraph.terms import Term
from mlir_nn.ir import Graph, verify
from tests.egraph.util import assert_same, trace_mlp


@pytest.fixture(scope="module")
def step():
    return trace_mlp([3, 16, 16, 1], 32)[0]


@pytest.mark.parametrize("limits, reason", [
    (Limits(iterations=1), "iteration limit"),
    (Limits(nodes=10), "node limit"),
    (Limits(seconds=0.0), "time limit"),
])
def test_a_limit_stops_saturation_and_is_reported(step, limits, reason):
    optimized, report = optimize(step, limits=limits)
    assert report.stop_reason == reason and report.iterations >= 1
    assert report.error is None
    verify(optimized)
    assert_same(step, optimized)


@pytest.mark.parametrize("estimate, rows", [(None, 128), (32, 32), (100, 64)])
def test_the_optimized_graph_is_priced_at_the_batch_estimate(step, estimate, rows):
    """The optimized step carries the batch rows the optimizer priced it at (a power of two), for
    code generation to price its schedules at the same rows (the default estimate: 128)."""
    optimized, report = optimize(step, batch_estimate=estimate)
    assert optimized.batch_rows == rows and report.batch_estimate == (estimate or 128)


def test_rulesets_whose_ops_a_graph_lacks_are_left_out(step):
    """The image layout and convolution rules run only on graphs with convolutions or pools, the
    loss rules only on graphs with their loss (on an MLP the image rules cost a third more optimize
    time and matched nothing); every other ruleset runs on every graph."""
    from mlir_nn.egraph.driver import default_rulesets
    from mlir_nn.egraph.rules import RULESETS
    from tests.egraph.util import inp, op, par

    def all_but(*names: str) -> list[str]:
        return [name for name in RULESETS if name not in names]

    assert default_rulesets(step) == all_but("images", "conv", "classification")
    assert default_rulesets(_classifier_step("sgd")) == all_but("images", "conv", "mse")
    x, w = inp("x", ("N", 1, 8, 8)), par("w", (2, 1, 3, 3))
    conv = op("conv2d", x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)
    assert default_rulesets(Graph((x,), (w,), (conv,))) == all_but("mse", "classification")


def _classifier_step(optimizer: str) -> Graph:
    """The traced training step of a 5-16-16-3 classifier (cross-entropy on class probabilities)."""
    import numpy as np

    from mlir_nn.jit import trace_step
    from mlir_nn.losses import cross_entropy
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD, Adam
    from mlir_nn.trainer import train_step

    model = MLP(5, [16, 16, 3])
    opt = (Adam if optimizer == "adam" else SGD)(model.parameters(), lr=1e-3)
    arrays = [np.zeros((8, 5), np.float32), np.full((8, 3), 1 / 3, np.float32)]  # class probabilities
    return trace_step(train_step(model, opt, cross_entropy), arrays, ["x", "y"])[0]


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_rulesets_left_out_change_nothing(loss, optimizer):
    """Every ruleset but the image rules (which reorder layouts) gives an MLP step the same
    optimized graph as the default rulesets, which leave out those whose ops it lacks."""
    from mlir_nn.egraph.driver import default_rulesets
    from mlir_nn.egraph.rules import RULESETS

    traced = _classifier_step(optimizer) if loss == "cross_entropy" else \
        trace_mlp([5, 16, 16, 3], 8, "--optimizer", optimizer)[0]
    left_out = [name for name in RULESETS if name != "images" and name not in default_rulesets(traced)]
    assert left_out
    default, report = optimize(traced)
    every, every_report = optimize(traced, rulesets=[name for name in RULESETS if name != "images"])
    assert report.error is None and every_report.error is None
    assert default.fingerprint() == every.fingerprint()


LAZY_RULES = """
import json, sys
from mlir_nn.egraph import optimize
from tests.egraph.util import inp, op, par, trace_mlp

def loaded():
    return sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("mlir_nn.egraph.rules."))

seen = [loaded()]
optimized, report = optimize(trace_mlp([3, 5, 1], 8)[0])
seen.append(loaded())
x, w = inp("x", ("N", 1, 8, 8)), par("w", (2, 1, 3, 3))
conv = op("conv2d", x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1)
from mlir_nn.ir import Graph
optimized, report = optimize(Graph((x,), (w,), (conv,)))
seen.append(loaded())
print(json.dumps([seen, report.error]))
"""


def test_a_ruleset_is_imported_when_a_graph_needs_it():
    """Loading the optimizer imports no ruleset; an MLP's optimization imports every ruleset but
    the image layout rules, which a convolution's brings in (a fresh process)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", LAZY_RULES], capture_output=True, text=True, timeout=300, env=env,
                          cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    (before, mlp, image), error = json.loads(done.stdout.splitlines()[-1])
    assert before == [] and error is None
    assert not {"images", "conv", "classification"} & set(mlp) and {"algebra", "fusion", "update", "mse"} <= set(mlp)
    assert {"images", "conv"} <= set(image)


def test_saturates_within_limits(step):
    optimized, report = optimize(step)
    assert report.stop_reason == "saturated" and report.iterations < Limits().iterations
    assert report.egraph_nodes >= report.egraph_classes > 0
    assert report.used_optimized and report.nodes_after < report.nodes_before
    assert report.cost_after < report.cost_before
    text = str(report)
    for piece in ("saturated", "e-nodes", "e-classes", "compute nodes", "estimated cost", "rules applied",
                  "linear(x, W, b)"):
        assert piece in text


class _Unsound:
    """A ruleset claiming x^T == x: it equates terms of different shapes."""

    RULES = [("x^T = x", rewrite(Term.transpose(x, P2)).to(x))]
    RULESET = build("unsound", RULES)


def test_a_rule_failure_is_reported_and_the_traced_graph_kept(monkeypatch):
    graph = trace_mlp([3, 4, 2], 8)[0]
    monkeypatch.setitem(rules_pkg.RULESETS, "unsound", _Unsound)
    optimized, report = optimize(graph, rulesets=["layout", "unsound"])
    assert optimized == graph.with_batch_rows(report.batch_estimate)  # the traced graph, priced
    assert report.stop_reason == "error" and report.error and not report.used_optimized
    assert "optimizer failed" in str(report)


def test_unknown_ruleset_is_an_error_not_a_crash(step):
    optimized, report = optimize(step, rulesets=["nope"])
    assert optimized == step.with_batch_rows(report.batch_estimate) and "unknown ruleset" in report.error


def test_empty_and_trivial_graphs():
    from mlir_nn.ir import Graph
    from tests.egraph.util import inp, op

    x = inp("x", ("N", 3))
    for graph in (Graph((x,), (), ()), Graph((x,), (), (x, op("add", x, x)))):
        optimized, report = optimize(graph)
        assert report.error is None and optimized == graph.with_batch_rows(report.batch_estimate)
