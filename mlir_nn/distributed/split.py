"""Run a step that holds collectives: split it at them, reduce between two compiled halves.

The first half computes everything that does not depend on an ``allreduce_mean``: the
outputs and parameter updates that need no reduction, and every value the second half
reads (the collectives' operands among them). One MPI call (``comm.allreduce_mean``)
reduces all the operands together; the second half computes the rest from the reduced
values. Updates take effect only after both halves ran, so every node reads the old state,
as in the unsplit step. Each half is an ordinary graph, compiled by any backend.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from mlir_nn.backends import Executable, get_backend
from mlir_nn.distributed import comm
from mlir_nn.ir import Graph, Node, make_node, verify

COLLECTIVES = ("allreduce_mean",)
LEAVES = ("input", "param", "const")


def has_collectives(graph: Graph) -> bool:
    return any(n.op in COLLECTIVES for n in graph.nodes)


@dataclass(frozen=True)
class Split:
    """The two halves and how their values connect.

    ``first.outputs`` are the original outputs that need no reduction, then the updates
    that need none, then ``cut``: the values the second half reads and the collectives'
    operands. ``second.inputs`` are the original inputs it reads, then the cut values it
    reads (the first ``handed``), then one input per collective (its reduced operand).
    """

    first: Graph
    second: Graph
    first_outputs: list[int]  # original output index of each of first's leading outputs
    second_outputs: list[int]  # original output index of each of second's outputs
    first_updates: list[str]  # parameters updated from first's outputs after both halves ran
    cut: list[Node]  # first-half values that leave it: read by the second half (first), or reduced
    handed: int  # how many leading ``cut`` values the second half reads
    reduced: list[int]  # per collective, the index in ``cut`` of its operand
    second_inputs: list[int]  # per original input that second reads, its index in graph.inputs


def _graph(inputs: tuple[Node, ...], params: tuple[Node, ...], outputs: list[Node],
           updates: tuple[tuple[str, Node], ...], name: str) -> Graph:
    """A graph declaring only the inputs and params its outputs and updates use (updated
    params always)."""
    reached = set(Graph((), (), tuple(outputs) + tuple(n for _, n in updates)).nodes)
    updated = {name for name, _ in updates}
    return Graph(tuple(x for x in inputs if x in reached),
                 tuple(p for p in params if p in reached or p.attr("name") in updated),
                 tuple(outputs), updates, name=name)


def split_graph(graph: Graph) -> Split:
    """Cut ``graph`` at its collectives (see the module docstring)."""
    after: set[Node] = set()
    for n in graph.nodes:
        if n.op in COLLECTIVES or any(i in after for i in n.inputs):
            after.add(n)
    collectives = [n for n in graph.nodes if n.op in COLLECTIVES]
    for c in collectives:
        if c.inputs[0].op in LEAVES:
            raise ValueError(f"{graph.name}: allreduce_mean of a {c.inputs[0].op} is not supported; "
                             "reduce a computed value")
    read: list[Node] = []  # first-half values read by second-half nodes
    for n in graph.nodes:
        if n in after and n.op not in COLLECTIVES:
            read.extend(i for i in n.inputs if i not in after and i.op not in LEAVES and i not in read)
    cut = read + [o for o in dict.fromkeys(c.inputs[0] for c in collectives) if o not in read]
    early_outputs = [k for k, o in enumerate(graph.outputs) if o not in after]
    late_outputs = [k for k, o in enumerate(graph.outputs) if o in after]
    early_updates = [(name, n) for name, n in graph.updates if n not in after]
    for node in [graph.outputs[k] for k in early_outputs] + [n for _, n in early_updates]:
        if node.op in LEAVES:
            raise ValueError(f"{graph.name}: a step that returns or assigns a {node.op} as is cannot be split "
                             "at its allreduce")
    first = _graph(graph.inputs, graph.params,
                   [graph.outputs[k] for k in early_outputs] + [n for _, n in early_updates] + cut, (),
                   f"{graph.name}_before_allreduce")

    renamed: dict[Node, Node] = {}
    for i, n in enumerate(read):
        renamed[n] = make_node("input", (), name=f"cut{i}", shape=n.shape, dtype=n.dtype)
    for i, n in enumerate(collectives):
        renamed[n] = make_node("input", (), name=f"reduced{i}", shape=n.shape, dtype=n.dtype)
    for n in graph.nodes:
        if n in after and n not in renamed:
            renamed[n] = make_node(n.op, [renamed.get(i, i) for i in n.inputs], **n.attr_dict)
    late_updates = tuple((name, renamed[n]) for name, n in graph.updates if n in after)
    inputs = graph.inputs + tuple(renamed[n] for n in read + collectives)
    second = _graph(inputs, graph.params, [renamed[graph.outputs[k]] for k in late_outputs], late_updates,
                    f"{graph.name}_after_allreduce")
    verify(first)
    verify(second)
    return Split(first, second, early_outputs, late_outputs, [name for name, _ in early_updates], cut, len(read),
                 [cut.index(c.inputs[0]) for c in collectives], [k for k, x in enumerate(graph.inputs)
                                                                 if x in second.inputs])


class SplitExecutable:
    """Executable protocol for a step with collectives: first half, one allreduce, second half."""

    def __init__(self, graph: Graph, backend: str) -> None:
        self.graph = graph
        self.split = split_graph(graph)
        compile_half = get_backend(backend).compile
        self.first: Executable = compile_half(self.split.first)
        self.second: Executable = compile_half(self.split.second)
        slot = {p.attr("name"): i for i, p in enumerate(graph.params)}
        self._first_inputs = [k for k, x in enumerate(graph.inputs) if x in self.split.first.inputs]
        self._first_params = [slot[p.attr("name")] for p in self.split.first.params]
        self._second_params = [slot[p.attr("name")] for p in self.split.second.params]
        self._late_update_slots = [slot[name] for name in self.split.first_updates]
        self.stages: dict[str, str] = {}
        for half, executable in (("before allreduce", self.first), ("after allreduce", self.second)):
            for stage, text in getattr(executable, "stages", {}).items():
                self.stages[stage] = self.stages.get(stage, "") + f"// {half}\n{text}\n"
        self.allreduce_seconds = 0.0  # total time spent in the reductions, for benchmarks

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        s = self.split
        early = self.first.run([inputs[k] for k in self._first_inputs], [params[i] for i in self._first_params])
        n_out, n_upd = len(s.first_outputs), len(s.first_updates)
        cut_values = early[n_out + n_upd:]
        start = time.perf_counter()
        reduced = comm.allreduce_mean([cut_values[i] for i in s.reduced])
        self.allreduce_seconds += time.perf_counter() - start
        late = self.second.run([inputs[k] for k in s.second_inputs] + cut_values[:s.handed] + reduced,
                               [params[i] for i in self._second_params])
        for slot, value in zip(self._late_update_slots, early[n_out:n_out + n_upd]):
            params[slot][...] = value
        outputs: list[np.ndarray] = [np.empty(0)] * len(self.graph.outputs)
        for k, value in zip(s.first_outputs, early[:n_out]):
            outputs[k] = value
        for k, value in zip(s.second_outputs, late):
            outputs[k] = value
        return outputs


def compile_step(backend: str, graph: Graph, traced: Graph | None = None) -> Executable:
    """``backend``'s executable for ``graph``; a step with collectives is split at them, after
    checking that every rank traced the same step (``traced``, else ``graph``). Outside
    ``distributed.init()`` the reduction is over one process: its values pass unchanged."""
    if not has_collectives(graph):
        return get_backend(backend).compile(graph)
    if not comm.is_initialized():
        return SplitExecutable(graph, backend)
    check_same_step(traced or graph)
    executable = SplitExecutable(graph, backend)
    # A cold compile can take long and not as long on every rank: wait for it with a longer
    # deadline here, so the step's first reduction is not the one that times out.
    comm.synchronize(f"{graph.name}: compiling on every rank", comm.COMPILE_TIMEOUT)
    return executable


def check_same_step(graph: Graph) -> None:
    """Raise DistributedError unless every rank traced a graph with this fingerprint."""
    fingerprints = comm.allgather(graph.fingerprint())
    differing = [r for r, f in enumerate(fingerprints) if f != fingerprints[0]]
    if differing:
        raise comm.DistributedError(
            f"{graph.name}: ranks {differing} traced a different step than rank 0 (graph fingerprints "
            f"{', '.join(f[:12] for f in fingerprints)}); every rank must run the same model, optimizer and "
            "input shapes"
        )
