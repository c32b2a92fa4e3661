"""Helpers for the e-graph tests: build graphs, random arguments, compare two graphs."""

from __future__ import annotations

import numpy as np

from mlir_nn.backends.reference import evaluate
from mlir_nn.cli import build_parser, build_step
from mlir_nn.egraph.convert import EClasses
from mlir_nn.egraph.cost import CostModel
from mlir_nn.egraph.driver import Limits, Report, build_egraph, extract_graph, node_cost_fn
from mlir_nn.ir import Graph, Node, make_node
from mlir_nn.ir.shapes import resolve
from mlir_nn.jit import trace_step

F64 = "float64"


def inp(name: str, shape: tuple) -> Node:
    return make_node("input", (), name=name, shape=shape, dtype=F64)


def par(name: str, shape: tuple) -> Node:
    return make_node("param", (), name=name, shape=shape, dtype=F64, label=name)


def const(value: float) -> Node:
    return make_node("const", (), value=float(value), dtype=F64)


def op(name: str, *inputs: Node, **attrs) -> Node:
    return make_node(name, inputs, **attrs)


def graph_of(inputs: list[Node], params: list[Node], outputs: list[Node], updates=()) -> Graph:
    return Graph(tuple(inputs), tuple(params), tuple(outputs), tuple(updates))


def trace_mlp(widths: list[int], batch: int, *extra: str, dtype: str = F64):
    """The traced training step of an MLP (cli options in ``extra``) and example x, y."""
    args = build_parser().parse_args(
        ["compile", "--mlp", ",".join(map(str, widths)), "--batch", str(batch), "--dtype", dtype, *extra])
    step, x, y = build_step(args)
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    return graph, x, y


def random_arguments(graph: Graph, batch: int, rng: np.random.Generator):
    """Random inputs and parameters, optimizer state and hyperparameters kept in their domains
    (step counts >= 1, moments >= 0, betas, eps and lr in (0, 1)), so no sqrt or power sees a
    value it is undefined for."""
    inputs = [rng.standard_normal(resolve(n.shape, batch)) for n in graph.inputs]
    params = []
    for p in graph.params:
        shape = resolve(p.shape, batch)
        label = p.attr("label") or ""
        if label.endswith(".step"):
            value = rng.integers(1, 10, shape).astype(np.float64)
        elif label.endswith(".state"):
            value = np.abs(rng.standard_normal(shape))  # momentum buffers and Adam's moments
        elif label.startswith(("Adam.", "SGD.")):
            value = rng.uniform(0.1, 0.9, shape)  # fed hyperparameters
        else:
            value = rng.standard_normal(shape)
        params.append(value)
    return inputs, params


def assert_same(original: Graph, optimized: Graph, batch: int = 7, seed: int = 0, rtol: float = 1e-10) -> None:
    """Both graphs give the same outputs and updates (reference backend, float64)."""
    inputs, params = random_arguments(original, batch, np.random.default_rng(seed))
    want = evaluate(original, inputs, params, batch)
    got = evaluate(optimized, inputs, params, batch)
    for w, g in zip(want[0] + want[1], got[0] + got[1]):
        assert np.all(np.isfinite(w)), "the reference result is not finite: the arguments are out of the ops' domains"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(w), initial=0))))


def saturated(graph: Graph, rulesets: list[str], limits: Limits | None = None):
    report = Report()
    egraph, loaded = build_egraph(graph, rulesets, limits or Limits(), report)
    return egraph, loaded, report


def random_extraction(egraph, loaded, seed: int) -> Graph:
    """A program drawn from the e-graph with random e-node costs: any equality may be used."""
    rng = np.random.default_rng(seed)

    def costs(eclasses: EClasses):
        known = node_cost_fn(eclasses, CostModel(batch=8), 8)
        return lambda cid, enode: None if known(cid, enode) is None else float(rng.uniform())

    return extract_graph(egraph, loaded, costs)[0]


def round_trip(graph: Graph) -> Graph:
    """Load into egglog, run no rules, extract with the real cost model."""
    egraph, loaded, _ = saturated(graph, [])
    return extract_graph(egraph, loaded, lambda ec: node_cost_fn(ec, CostModel(), 8))[0]
