"""A traced step: nodes reachable from its outputs and parameter updates."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from mlir_nn.ir.node import Node, freeze_attrs
from mlir_nn.ir.ops import TensorType, op_def
from mlir_nn.ir.printer import print_graph
from mlir_nn.ir.shapes import BATCH


def make_node(op: str, inputs: tuple[Node, ...] | list[Node], **attrs: Any) -> Node:
    """Create a node, checking operands with the op's shape rule."""
    definition = op_def(op)
    inputs = tuple(inputs)
    if definition.arity is not None and len(inputs) != definition.arity:
        raise ValueError(f"{op}: expected {definition.arity} operands, got {len(inputs)}")
    result = definition.infer([TensorType(i.shape, i.dtype) for i in inputs], attrs)
    return Node(op, inputs, freeze_attrs(attrs), tuple(result.shape), result.dtype)


def topo_order(roots: list[Node] | tuple[Node, ...]) -> list[Node]:
    """Every node reachable from ``roots``, each after its inputs (iterative, no recursion)."""
    order: list[Node] = []
    seen: set[Node] = set()
    for root in roots:
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.inputs) if i not in seen)
    return order


BATCH_ROWS_MAX = 1 << 16


def batch_rows_bucket(rows: int) -> int:
    """``rows`` rounded down to a power of two (1 to BATCH_ROWS_MAX): steps traced at batches of
    one bucket compile to the same code."""
    return 1 << (min(max(int(rows), 1), BATCH_ROWS_MAX).bit_length() - 1)


@dataclass(frozen=True)
class Graph:
    """A whole step: named inputs, parameters (state), outputs and parameter updates.

    ``updates`` pairs a parameter's name with the node holding its new value; all
    updates take effect together after the step, so every node reads the old state.
    ``batch_rows``: the rows of a dynamic batch that the optimizer priced the step at (a power
    of two, ``batch_rows_bucket``), which code generation prices its schedules at too; None
    where nobody estimated it. Part of the graph's text, so of every cache key.
    """

    inputs: tuple[Node, ...]
    params: tuple[Node, ...]
    outputs: tuple[Node, ...]
    updates: tuple[tuple[str, Node], ...] = ()
    name: str = "step"
    batch_rows: int | None = None
    _nodes: tuple[Node, ...] = field(init=False, repr=False, compare=False)
    _params_by_name: dict[str, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        roots = list(self.outputs) + [n for _, n in self.updates]
        object.__setattr__(self, "_nodes", tuple(topo_order(roots)))
        by_name: dict[str, Node] = {}
        for p in self.params:
            by_name.setdefault(p.attr("name"), p)
        object.__setattr__(self, "_params_by_name", by_name)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes in a valid execution order."""
        return self._nodes

    def param_by_name(self, name: str) -> Node:
        try:
            return self._params_by_name[name]
        except KeyError:
            raise KeyError(f"graph has no parameter {name!r}") from None

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self._nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    @property
    def compute_nodes(self) -> list[Node]:
        """Nodes that do work (not inputs, params or constants)."""
        return [n for n in self._nodes if n.op not in ("input", "param", "const")]

    def input_types(self) -> list[TensorType]:
        return [TensorType(n.shape, n.dtype) for n in self.inputs]

    def with_batch_rows(self, rows: int | None) -> Graph:
        """This graph priced at a batch of ``rows`` (bucketed by ``batch_rows_bucket``); itself
        when its inputs have no dynamic batch or ``rows`` is None."""
        if rows is None or not any(BATCH in n.shape for n in self.inputs):
            return self
        return replace(self, batch_rows=batch_rows_bucket(rows))

    @cached_property
    def text(self) -> str:
        """The graph printed (``print_graph``), once: a compile asks for it three or four times
        (cache keys, the stages it keeps), 2 ms each for a 16-layer MLP's step."""
        return print_graph(self)

    def fingerprint(self) -> str:
        """Stable hex digest of the graph's text: equal across processes and runs."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def __str__(self) -> str:
        return self.text
