"""The NumPy reference backend: an interpreter of the IR, the oracle for all others."""

from __future__ import annotations

import numpy as np

from mlir_nn.ir import Graph, Node, op_def
from mlir_nn.ir.arguments import check_arguments, label_inputs
from mlir_nn.ir.shapes import resolve
from mlir_nn.support.interrupts import interrupts_deferred


def evaluate(graph: Graph, inputs: list[np.ndarray], params: list[np.ndarray],
             batch: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Run the graph; return (outputs, new parameter values in ``graph.updates`` order)."""
    values: dict[Node, np.ndarray] = dict(zip(graph.inputs, inputs))
    values.update(zip(graph.params, params))
    for node in graph.nodes:
        if node in values:
            continue
        check_bound(node)
        values[node] = run_node(node, [values[i] for i in node.inputs], node.attr_dict, resolve(node.shape, batch))
    return [values[o] for o in graph.outputs], [values[u] for _, u in graph.updates]


def check_bound(node: Node) -> None:
    """Raise unless ``node``'s op has a reference (a leaf that is no input or parameter has none)."""
    if op_def(node.op).reference is None:
        raise ValueError(f"{node.op}: node is not bound (a leaf missing from the graph's declarations)")


def run_node(node: Node, args: list[np.ndarray], attrs: dict, shape: tuple[int, ...]) -> np.ndarray:
    """``node``'s reference on ``args``, as its dtype, checked against its ``shape``."""
    result = np.asarray(op_def(node.op).reference(args, attrs, shape), dtype=node.dtype)
    if result.shape != shape:
        raise AssertionError(f"{node.op}: reference produced {result.shape}, shape rule says {shape}")
    return result


def own(value: np.ndarray, others: list[np.ndarray]) -> np.ndarray:
    """``value``, copied when it may share memory with any of ``others``."""
    return value.copy() if any(np.may_share_memory(value, a) for a in others) else value


class ReferenceExecutable:
    """Interprets the graph on every call; updates parameters only after all succeeded, all
    of them or (interrupted before the first write) none."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        index = {p.attr("name"): i for i, p in enumerate(graph.params)}
        self._update_slots = [index[name] for name, _ in graph.updates]
        self._labels = label_inputs(graph)  # found once, not on every call

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Outputs are arrays of their own, as on every backend: an output that is an argument
        (or a view of one) is copied before the parameters are written."""
        batch = check_arguments(self.graph, inputs, params, labels=self._labels)
        outputs, updates = evaluate(self.graph, inputs, params, batch)
        arguments = [*inputs, *params]
        outputs = [own(o, arguments) for o in outputs]
        self._write_updates(params, [own(u, params) for u in updates])
        return outputs

    def _write_updates(self, params: list[np.ndarray], updates: list[np.ndarray | None]) -> None:
        """Write the new parameter values, computed whole before (none reads a parameter about to
        be written: ``own``; None: written in place already); the writes run whole, a Ctrl-C
        waits for them."""
        with interrupts_deferred():
            for slot, value in zip(self._update_slots, updates):
                if value is not None:
                    params[slot][...] = value


class ReferenceBackend:
    name = "numpy"

    def compile(self, graph: Graph) -> ReferenceExecutable:
        return ReferenceExecutable(graph)
