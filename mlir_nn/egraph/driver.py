"""``optimize``: load a graph into egglog, saturate within limits, extract, verify.

Saturation runs one iteration of every selected ruleset at a time (a few, while the e-graph is far
below its e-node budget), from Python, so the iteration, e-node and time limits are checked between
them; hitting one stops the run and is reported (the e-graph so far is still extracted: every
e-graph is sound).
Any failure (an egglog error, a graph that does not verify) is reported and the input
graph is returned unchanged. So is the input when the optimized graph is not cheaper.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from egglog import EGraph

from mlir_nn.egraph import convert, isolation
from mlir_nn.egraph.convert import ClassId, EClasses, ENode, Loaded
from mlir_nn.egraph.cost import CostModel
from mlir_nn.egraph.extract import extract
from mlir_nn.egraph.report import Report
from mlir_nn.egraph.rules import NEEDS_OPS, RULESETS
from mlir_nn.egraph.terms import Term
from mlir_nn.ir import BATCH, Graph, verify
from mlir_nn.ir.layouts import NCHW

NodeCost = Callable[[ClassId, ENode], float | None]


@dataclass(frozen=True)
class Limits:
    """Bounds on saturation: iterations, e-nodes in the e-graph, wall-clock seconds.

    ``nodes`` None scales the e-node budget with the traced graph: ``NODES_PER_NODE`` e-nodes
    per traced node, at least ``MIN_NODES`` (a fixed budget would stop deep models' rewrites
    halfway down)."""

    iterations: int = 16
    nodes: int | None = None
    seconds: float = 5.0

    NODES_PER_NODE = 4
    MIN_NODES = 20_000

    def node_budget(self, traced_nodes: int) -> int:
        if self.nodes is not None:
            return self.nodes
        return max(self.MIN_NODES, self.NODES_PER_NODE * traced_nodes)


def default_batch(graph: Graph) -> int:
    return 128 if any(BATCH in n.shape for n in graph.inputs) else 1


def _count(egraph: EGraph) -> int:
    """E-nodes in the e-graph (rows of the Term constructors)."""
    return sum(n for fn, n in egraph.all_function_sizes() if str(fn).startswith(Term.__name__ + "."))


BATCH_MAX = 4  # saturation iterations per egglog call at most


def saturate(egraph: EGraph, names: list[str], limits: Limits, report: Report, traced_nodes: int) -> None:
    """Run the rulesets an iteration (or a few) at a time until saturated or a limit is hit."""
    budget = limits.node_budget(traced_nodes)
    modules = [RULESETS[n] for n in names]
    rule_names = {rule.decl: name for m in modules for name, rule in m.RULES}
    schedule = modules[0].RULESET
    for m in modules[1:]:
        schedule = schedule + m.RULESET
    start = time.perf_counter()
    report.stop_reason = "saturated"
    batch = 1
    while True:
        if report.iterations >= limits.iterations:
            report.stop_reason = "iteration limit"
            break
        # iterations per egglog call (each call costs ~6 ms besides its matching): 1 at first, then
        # doubling up to BATCH_MAX while the e-graph is far below its budget (the layout rules move
        # a transpose one op per iteration: VGG-small's step saturates in 10)
        batch = min(batch, limits.iterations - report.iterations)
        result = egraph.run(schedule * batch if batch > 1 else schedule)
        report.iterations += batch
        for decl, n in result.num_matches_per_rule.items():
            if n and decl in rule_names:
                report.rules_applied[rule_names[decl]] = report.rules_applied.get(rule_names[decl], 0) + n
        if not result.updated:
            break
        nodes = _count(egraph)
        if nodes > budget:
            report.stop_reason = "node limit"
            break
        batch = min(2 * batch, BATCH_MAX) if nodes * 4 < budget else 1
        if time.perf_counter() - start > limits.seconds:
            report.stop_reason = "time limit"
            break


def node_cost_fn(eclasses: EClasses, model: CostModel, itemsize: int) -> NodeCost:
    """Cost of an e-node from the shapes of its e-class and children; None if unknown."""

    def cost(cid: ClassId, enode: ENode) -> float | None:
        shapes = eclasses.shapes
        if cid not in shapes or not all(c in shapes for c in enode.children):
            return None
        return model.node_cost(enode.op, dict(enode.attrs), [shapes[c] for c in enode.children], shapes[cid],
                               itemsize)

    return cost


def build_egraph(graph: Graph, names: list[str], limits: Limits, report: Report) -> tuple[EGraph, Loaded]:
    """An e-graph holding ``graph``, saturated with the named rulesets."""
    unknown = [n for n in names if n not in RULESETS]
    if unknown:
        raise ValueError(f"unknown ruleset(s) {unknown}; known: {', '.join(RULESETS)}")
    egraph = EGraph()
    with _stage(report, "load"):
        loaded = convert.load(egraph, graph)
    if names:
        with _stage(report, "saturate"):
            saturate(egraph, names, limits, report, len(graph.nodes))
    else:
        report.stop_reason = "no rules"
    return egraph, loaded


@contextmanager
def _stage(report: Report, name: str) -> Iterator[None]:
    """Add the time spent in the block to the report's ``name`` stage."""
    start = time.perf_counter()
    try:
        yield
    finally:
        report.stage_seconds[name] = report.stage_seconds.get(name, 0.0) + time.perf_counter() - start


def optimize(graph: Graph, batch_estimate: int | None = None, *, rulesets: list[str] | None = None,
             limits: Limits = Limits(), cost_model: CostModel | None = None) -> tuple[Graph, Report]:
    """Optimize ``graph`` by equality saturation; return (graph to run, report). Safe to call
    from several threads and in forked processes (see ``mlir_nn.egraph.isolation``)."""
    options = {"rulesets": rulesets, "limits": limits, "cost_model": cost_model}
    if isolation.must_use_fresh_process():
        return isolation.in_fresh_process(optimize_here, graph, batch_estimate, **options)
    return isolation.on_this_thread(lambda: optimize_here(graph, batch_estimate, **options))


def default_rulesets(graph: Graph) -> list[str]:
    """Every ruleset, less those whose ``NEEDS_OPS`` the graph has none of (those are not imported)."""
    ops = {n.op for n in graph.nodes}
    return [name for name in RULESETS if name not in NEEDS_OPS or ops & NEEDS_OPS[name]]


def optimize_here(graph: Graph, batch_estimate: int | None = None, *, rulesets: list[str] | None = None,
                  limits: Limits = Limits(), cost_model: CostModel | None = None) -> tuple[Graph, Report]:
    """``optimize`` in the calling thread, with no locking."""
    start = time.perf_counter()
    model = cost_model or CostModel(batch=batch_estimate or default_batch(graph))
    report = Report(nodes_before=len(graph.compute_nodes), cost_before=model.graph_cost(graph),
                    kernels_before=model.kernels(graph), batch_estimate=model.batch)
    names = default_rulesets(graph) if rulesets is None else rulesets
    try:
        egraph, loaded = build_egraph(graph, names, limits, report)
        itemsize = max(np.dtype(n.dtype).itemsize for n in graph.nodes) if graph.nodes else 4
        with _stage(report, "extract"):
            optimized, eclasses = extract_graph(egraph, loaded, lambda ec: node_cost_fn(ec, model, itemsize))
        report.egraph_nodes, report.egraph_classes = eclasses.num_nodes, len(eclasses.nodes)
        with _stage(report, "verify"):
            verify(optimized)
    except Exception as e:  # any failure: report it and keep the traced graph
        report.error = f"{type(e).__name__}: {e}"
        report.stop_reason = "error"
        optimized = graph
    report.cost_after = model.graph_cost(optimized)
    if report.cost_after >= report.cost_before:
        optimized, report.cost_after = graph, report.cost_before
    report.used_optimized = optimized is not graph
    report.nodes_after = len(optimized.compute_nodes)
    report.kernels_after = model.kernels(optimized)
    report.seconds = time.perf_counter() - start
    return optimized.with_batch_rows(model.batch), report


def extract_graph(egraph: EGraph, loaded: Loaded,
                  node_costs: Callable[[EClasses], NodeCost]) -> tuple[Graph, EClasses]:
    """The cheapest program in the e-graph as a Graph, costed by ``node_costs(eclasses)``.

    Extraction runs twice, with and without the NHWC e-nodes, and keeps the cheaper program: a
    layout is a choice of many e-classes at once (a run of convolutions and pools, the transposes
    at its ends), which the extractor's one-class switches cannot undo when its first, tree-cost
    pick is NHWC where the backward ops' NCHW reads make NCHW cheaper (VGG-small's training step)."""
    eclasses = convert.read_eclasses(egraph, loaded)
    costs = node_costs(eclasses)
    choice, total = extract(eclasses, costs)
    if any(_nhwc(enode) for enode in choice.values()):
        nchw, nchw_total = extract(eclasses, lambda cid, enode: None if _nhwc(enode) else costs(cid, enode))
        if nchw_total <= total:
            choice = nchw
    return convert.build_graph(eclasses, choice, loaded), eclasses


def _nhwc(enode: ENode) -> bool:
    return dict(enode.attrs).get("layout", NCHW) != NCHW
