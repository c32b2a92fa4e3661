"""Graphviz drawings of eager tensor graphs and traced IR graphs (DOT text, optional render)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from mlir_nn.engine import LEAF, Tensor, _topo_tensors
from mlir_nn.ir import Graph, Node
from mlir_nn.ir.printer import type_text


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value_text(a: np.ndarray) -> str:
    return f"{float(a):.4f}" if a.ndim == 0 else f"shape {tuple(a.shape)}"


def _tensor_dot(root: Tensor) -> list[str]:
    lines = []
    for t in _topo_tensors(root):
        tid = f"t{id(t)}"
        label = f"{t.label or ''} | data {_value_text(t.data)} | grad {_value_text(t.grad)}"
        lines.append(f"  {tid} [shape=record, label={_quote('{ ' + label + ' }')}];")
        if t._op not in (LEAF, "const"):
            lines.append(f"  {tid}_op [shape=circle, label={_quote(t._op)}];")
            lines.append(f"  {tid}_op -> {tid};")
            for inp in t._inputs:
                lines.append(f"  t{id(inp)} -> {tid}_op;")
    return lines


def _graph_dot(graph: Graph) -> list[str]:
    forward: set[Node] = set(Graph(graph.inputs, graph.params, graph.outputs).nodes)
    ids = {n: f"n{i}" for i, n in enumerate(graph.nodes)}
    lines = []
    for n in graph.nodes:
        if n.op in ("input", "param"):
            text, style = f"{n.attr('name')} | {type_text(n)}", "shape=record, style=filled, fillcolor=lightyellow"
            if n.attr("label"):
                text = f"{n.attr('label')} | {text}"
        elif n.op == "const":
            text, style = f"{n.attr('value'):g}", "shape=plaintext"
        else:
            backward = n not in forward
            text = f"{n.op} | {type_text(n)}"
            style = "shape=record, style=filled, fillcolor=" + ("lightpink" if backward else "lightblue")
        lines.append(f"  {ids[n]} [{style}, label={_quote('{ ' + text + ' }' if 'record' in style else text)}];")
        for i in n.inputs:
            lines.append(f"  {ids[i]} -> {ids[n]};")
    for k, out in enumerate(graph.outputs):
        lines.append(f"  out{k} [shape=doublecircle, label={_quote(f'output {k}')}];")
        lines.append(f"  {ids[out]} -> out{k};")
    for name, node in graph.updates:
        lines.append(f"  {ids[node]} -> {ids[graph.param_by_name(name)]} [style=dashed, color=red, label=\"update\"];")
    return lines


def draw_graph(obj: Tensor | Graph, path: str | None = None, rankdir: str = "LR") -> str:
    """DOT text for a tensor's graph (values and grads) or a traced Graph (forward blue,
    backward pink, updates dashed red). With ``path`` (.svg/.png/.pdf), also render it
    when Graphviz's ``dot`` is installed; raise RuntimeError if it is not."""
    body = _tensor_dot(obj) if isinstance(obj, Tensor) else _graph_dot(obj)
    dot = "\n".join([f"digraph mlir_nn {{\n  rankdir={rankdir};", *body, "}"]) + "\n"
    if path is not None:
        exe = shutil.which("dot")
        if exe is None:
            raise RuntimeError("draw_graph: rendering needs Graphviz's 'dot' program, which is not installed")
        fmt = Path(path).suffix.lstrip(".") or "svg"
        subprocess.run([exe, f"-T{fmt}", "-o", path], input=dot.encode(), check=True)
    return dot
