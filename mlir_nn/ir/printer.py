"""Stable, readable text form of a Graph (same graph, same text)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlir_nn.ir.node import Node

if TYPE_CHECKING:
    from mlir_nn.ir.graph import Graph

SHORT_DTYPE = {"float32": "f32", "float64": "f64"}


def type_text(node: Node) -> str:
    return f"{SHORT_DTYPE.get(node.dtype, node.dtype)}[{', '.join(str(d) for d in node.shape)}]"


def _attr_text(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_attr_text(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def print_graph(graph: Graph) -> str:
    """Render the graph; nodes are numbered in execution order."""
    names: dict[Node, str] = {}
    for n in graph.inputs + graph.params:
        names[n] = "%" + n.attr("name")
    sig = ", ".join(f"{names[n]}: {type_text(n)}" for n in graph.inputs)
    lines = [f"graph @{graph.name}({sig}) {{"]
    if graph.batch_rows is not None:
        lines.append(f"  // priced at a batch of {graph.batch_rows} rows")
    for p in graph.params:
        label = p.attr("label")
        lines.append(f"  param {names[p]}: {type_text(p)}" + (f'  "{label}"' if label else ""))
    counter = 0
    for n in graph.nodes:
        if n in names:
            continue
        if n.op == "const":
            names[n] = _attr_text(n.attr("value"))
            continue
        name = f"%{counter}"
        counter += 1
        names[n] = name
        args = ", ".join(names[i] for i in n.inputs)
        attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in n.attrs)
        lines.append(f"  {name} = {n.op}({args}{', ' if args and attrs else ''}{attrs}) : {type_text(n)}")
    for i, out in enumerate(graph.outputs):
        lines.append(f"  output {i} = {names[out]}")
    for pname, node in graph.updates:
        lines.append(f"  update %{pname} <- {names[node]}")
    lines.append("}")
    return "\n".join(lines) + "\n"
