"""Graph -> egglog terms, and the saturated e-graph -> plain Python e-classes -> Graph.

``load`` adds every node of a graph to an EGraph as a let-bound term and records its
shape; ``read_eclasses`` snapshots the e-graph (``EGraph.freeze``) into ``EClasses``, the
form the extractor and cost model work on; ``build_graph`` turns one chosen e-node per
e-class back into IR nodes (through ``make_node``, so every shape rule is checked again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph, Vec, i64, set_
from egglog.declarations import CallDecl, ClassMethodRef, InitRef, LitDecl, ValueDecl

from mlir_nn.egraph.terms import BATCH_DIM, Term, dtype, shape
from mlir_nn.ir import Graph, Node, make_node
from mlir_nn.ir.shapes import BATCH, Shape

REQUIRED = object()

# op -> (attribute name, kind, default) in constructor argument order, after the operands.
# kind: "bool", "i64", "f64", "str" or "dims" (a tuple of ints, the batch symbol allowed).
TRANSPOSE_FLAGS = (("transpose_a", "bool", False), ("transpose_b", "bool", False))
SPECS: dict[str, tuple[tuple[str, str, Any], ...]] = {
    **{op: () for op in ("add", "sub", "mul", "div", "neg", "relu", "tanh", "sigmoid", "exp", "log", "sqrt",
                         "relu_grad", "tanh_grad", "sigmoid_grad", "mse", "mse_grad")},
    "pow": (("exponent", "f64", REQUIRED),),
    "matmul": TRANSPOSE_FLAGS,
    "transpose": (("perm", "dims", REQUIRED),),
    "reshape": (("shape", "dims", REQUIRED),),
    "broadcast_to": (("shape", "dims", REQUIRED),),
    "sum_to": (("shape", "dims", REQUIRED),),
    "sum": (("axes", "dims", REQUIRED), ("keepdims", "bool", REQUIRED)),
    "mean": (("axes", "dims", REQUIRED), ("keepdims", "bool", REQUIRED)),
    "mean_grad": (("shape", "dims", REQUIRED), ("axes", "dims", REQUIRED)),
    "linear": TRANSPOSE_FLAGS + (("activation", "str", REQUIRED),),
    "gemm": TRANSPOSE_FLAGS + (("subtract", "bool", False),),
    "matmul_relu_grad": TRANSPOSE_FLAGS,
    "log_softmax": (("axis", "i64", REQUIRED),),
    "log_softmax_grad": (("axis", "i64", REQUIRED),),
    "softmax_xent_grad": (("scale", "f64", REQUIRED),),
}
LEAVES = ("input", "param")

ClassId = Any  # an egglog e-class id (bindings.Value): hashable, opaque


def dims_vec(dims: Shape) -> Vec[i64]:
    return Vec[i64](*(BATCH_DIM if d == BATCH else int(d) for d in dims))


def _has_spec(node: Node) -> bool:
    spec = SPECS.get(node.op)
    if spec is None:
        return False
    names = {name for name, _, _ in spec}
    required = {name for name, _, default in spec if default is REQUIRED}
    given = set(node.attr_dict)
    return required <= given <= names


def _attr_arg(kind: str, value: Any) -> Any:
    if kind == "dims":
        return dims_vec(tuple(value))
    if kind == "f64":
        return float(value)
    if kind == "i64":
        return int(value)
    return bool(value) if kind == "bool" else str(value)


@dataclass
class Loaded:
    """What ``load`` put into the e-graph: leaves and opaque ops by index, root let names."""

    graph: Graph
    leaves: list[Node]
    opaque: list[tuple[str, tuple]] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)  # let names of outputs then updates


def load(egraph: EGraph, graph: Graph) -> Loaded:
    """Add the graph's nodes to ``egraph`` (each let-bound, with its shape and dtype)."""
    leaves = list(graph.inputs + graph.params)
    loaded = Loaded(graph, leaves)
    leaf_index = {n: i for i, n in enumerate(leaves)}
    terms: dict[Node, Term] = {}
    shapes = []
    for i, node in enumerate(graph.nodes):
        args = [terms[x] for x in node.inputs]
        if node.op in LEAVES:
            term = Term.leaf(leaf_index[node])
        elif node.op == "const":
            term = Term.const(float(node.attr("value")), node.dtype)
        elif _has_spec(node):
            attrs = node.attr_dict
            extra = [_attr_arg(kind, attrs.get(name, default)) for name, kind, default in SPECS[node.op]]
            term = getattr(Term, node.op)(*args, *extra)
        else:
            loaded.opaque.append((node.op, node.attrs))
            term = Term.opaque(len(loaded.opaque) - 1, Vec[Term](*args) if args else Vec[Term].empty())
        terms[node] = egraph.let(f"n{i}", term)
        shapes.append(set_(shape(terms[node])).to(dims_vec(node.shape)))
        shapes.append(set_(dtype(terms[node])).to(node.dtype))
    if shapes:
        egraph.register(*shapes)
    for k, out in enumerate(graph.outputs):
        loaded.roots.append(f"o{k}")
        egraph.let(f"o{k}", terms[out])
    for k, (_, node) in enumerate(graph.updates):
        loaded.roots.append(f"u{k}")
        egraph.let(f"u{k}", terms[node])
    return loaded


@dataclass(frozen=True)
class ENode:
    """One e-node in IR terms: op, attributes (as ``make_node`` takes them), child e-classes."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    children: tuple[ClassId, ...]


@dataclass
class EClasses:
    """A snapshot of the e-graph: e-nodes and shape per e-class, root e-classes."""

    nodes: dict[ClassId, list[ENode]]
    shapes: dict[ClassId, Shape]
    roots: list[ClassId]

    @property
    def num_nodes(self) -> int:
        return sum(len(v) for v in self.nodes.values())


def _lit(arg: Any) -> Any:
    expr = arg.expr
    if isinstance(expr, LitDecl):
        return expr.value
    if isinstance(expr, CallDecl) and isinstance(expr.callable, InitRef):  # Vec[i64](...)
        return tuple(BATCH if a.expr.value == BATCH_DIM else a.expr.value for a in expr.args)
    raise TypeError(f"unexpected e-graph literal {expr!r}")


def _enode(call: CallDecl, loaded: Loaded) -> ENode:
    assert isinstance(call.callable, ClassMethodRef)
    op = call.callable.method_name
    args = call.args
    if op == "leaf":
        return ENode("leaf", (("index", args[0].expr.value),), ())
    if op == "const":
        return ENode("const", (("value", args[0].expr.value), ("dtype", args[1].expr.value)), ())
    if op == "opaque":
        name, attrs = loaded.opaque[args[0].expr.value]
        vec = args[1].expr
        children = tuple(a.expr.value for a in vec.args) if isinstance(vec, CallDecl) else ()
        return ENode(name, (("opaque", attrs),), children)
    operands = [a for a in args if isinstance(a.expr, ValueDecl)]
    spec = SPECS[op]
    attrs = []
    for (name, _, default), arg in zip(spec, args[len(operands):]):
        value = _lit(arg)
        if value != default or default is REQUIRED:
            attrs.append((name, value))
    return ENode(op, tuple(attrs), tuple(a.expr.value for a in operands))


def read_eclasses(egraph: EGraph, loaded: Loaded) -> EClasses:
    """Snapshot the Term e-classes, their shapes and the roots' e-classes."""
    frozen = egraph.freeze().decl
    nodes = {
        cid: [_enode(call, loaded) for call in calls]
        for cid, (tp, calls) in frozen.e_classes.items()
        if tp.ident.name == Term.__name__
    }
    shapes = {call.args[0].expr.value: _lit(result) for call, result in frozen.sets.items()
              if call.callable.ident.name == "shape"}
    roots = [frozen.let_bindings["$" + name].expr.value for name in loaded.roots]
    return EClasses(nodes, shapes, roots)


def build_graph(eclasses: EClasses, choice: dict[ClassId, ENode], loaded: Loaded) -> Graph:
    """The Graph made of the chosen e-node of every e-class reachable from the roots."""
    built: dict[ClassId, Node] = {}
    for root in eclasses.roots:
        stack: list[tuple[ClassId, bool]] = [(root, False)]
        while stack:
            cid, ready = stack.pop()
            if cid in built:
                continue
            enode = choice[cid]
            if not ready:
                stack.append((cid, True))
                stack.extend((c, False) for c in enode.children if c not in built)
                continue
            built[cid] = _make(enode, [built[c] for c in enode.children], loaded)
    graph = loaded.graph
    n_out = len(graph.outputs)
    outputs = tuple(built[c] for c in eclasses.roots[:n_out])
    updates = tuple((name, built[c]) for (name, _), c in zip(graph.updates, eclasses.roots[n_out:]))
    return Graph(graph.inputs, graph.params, outputs, updates, name=graph.name)


def _make(enode: ENode, inputs: list[Node], loaded: Loaded) -> Node:
    attrs = dict(enode.attrs)
    if enode.op == "leaf":
        return loaded.leaves[attrs["index"]]
    if "opaque" in attrs:
        return make_node(enode.op, inputs, **dict(attrs["opaque"]))
    return make_node(enode.op, inputs, **attrs)
