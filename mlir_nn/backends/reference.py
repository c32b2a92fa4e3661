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
        definition = op_def(node.op)
        if definition.reference is None:
            raise ValueError(f"{node.op}: node is not bound (a leaf missing from the graph's declarations)")
        args = [values[i] for i in node.inputs]
        out_shape = resolve(node.shape, batch)
        result = np.asarray(definition.reference(args, node.attr_dict, out_shape), dtype=node.dtype)
        if result.shape != out_shape:
            raise AssertionError(f"{node.op}: reference produced {result.shape}, shape rule says {out_shape}")
        values[node] = result
    return [values[o] for o in graph.outputs], [values[u] for _, u in graph.updates]


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
        outputs = [o.copy() if any(np.may_share_memory(o, a) for a in arguments) else o for o in outputs]
        # every new value is computed (and none reads a parameter about to be written) before
        # the first is written; the writes run whole, a Ctrl-C waits for them
        updates = [u.copy() if any(np.may_share_memory(u, p) for p in params) else u for u in updates]
        with interrupts_deferred():
            for slot, value in zip(self._update_slots, updates):
                params[slot][...] = value
        return outputs


class ReferenceBackend:
    name = "numpy"

    def compile(self, graph: Graph) -> ReferenceExecutable:
        return ReferenceExecutable(graph)
