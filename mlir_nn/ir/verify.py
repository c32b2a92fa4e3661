"""Structural checks of a Graph: every node well typed, names unique, updates fit."""

from __future__ import annotations

from mlir_nn.ir.graph import Graph
from mlir_nn.ir.ops import OPS, TensorType


class VerifyError(ValueError):
    """The graph breaks an invariant of the IR."""


def verify(graph: Graph) -> None:
    """Raise VerifyError naming the first broken invariant."""
    leaves = {"input": set(graph.inputs), "param": set(graph.params)}
    names = [n.attr("name") for n in graph.inputs + graph.params]
    if len(set(names)) != len(names):
        raise VerifyError(f"duplicate input/param names in {names}")
    for n in graph.nodes:
        if n.op not in OPS:
            raise VerifyError(f"node {n!r} uses unknown op {n.op!r}")
        if n.op in leaves and n not in leaves[n.op]:
            raise VerifyError(f"{n.op} node {n.attr('name')!r} is used but not declared by the graph")
        definition = OPS[n.op]
        if definition.arity is not None and len(n.inputs) != definition.arity:
            raise VerifyError(f"{n.op}: has {len(n.inputs)} operands, expected {definition.arity}")
        expected = definition.infer([TensorType(i.shape, i.dtype) for i in n.inputs], n.attr_dict)
        if (tuple(expected.shape), expected.dtype) != (n.shape, n.dtype):
            raise VerifyError(f"{n.op}: recorded type {n.shape}:{n.dtype} but the shape rule gives {expected}")
    updated = [name for name, _ in graph.updates]
    if len(set(updated)) != len(updated):
        raise VerifyError(f"a parameter is updated twice: {updated}")
    for name, node in graph.updates:
        try:
            param = graph.param_by_name(name)
        except KeyError as e:
            raise VerifyError(str(e)) from None
        if (param.shape, param.dtype) != (node.shape, node.dtype):
            raise VerifyError(
                f"update of {name}: new value {node.shape}:{node.dtype} differs from {param.shape}:{param.dtype}"
            )
