"""Graph -> egglog terms, and the saturated e-graph -> plain Python e-classes -> Graph.

``load`` adds every node of a graph to an EGraph in bulk (``mlir_nn.egraph.rows``: node i
is ``node(i)``) with its shape and dtype; ``read_eclasses`` snapshots the e-graph (the
Rust e-graph's frozen tables) into ``EClasses``, the form the extractor and cost model
work on; ``build_graph`` turns one chosen e-node per
e-class back into IR nodes (through ``make_node``, so every shape rule is checked again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph, bindings
from egglog.declarations import ClassMethodRef

from mlir_nn.egraph.rows import graph_rows, load_rows
from mlir_nn.egraph.terms import BATCH_DIM, Term
from mlir_nn.ir import Graph, Node, make_node
from mlir_nn.ir.shapes import BATCH, Shape

REQUIRED = object()

# op -> (attribute name, kind, default) in constructor argument order, after the operands.
# kind: "bool", "i64", "f64", "str" or "dims" (a tuple of ints, the batch symbol allowed).
TRANSPOSE_FLAGS = (("transpose_a", "bool", False), ("transpose_b", "bool", False))
CONV = (("stride", "dims", REQUIRED), ("padding", "dims", REQUIRED), ("dilation", "dims", REQUIRED),
        ("groups", "i64", REQUIRED))
LAYOUT = (("layout", "str", "NCHW"),)  # the window ops' image layout
POOL = (("kernel", "dims", REQUIRED), ("stride", "dims", REQUIRED), ("padding", "dims", REQUIRED),
        ("dilation", "dims", REQUIRED), ("ceil_mode", "bool", REQUIRED))
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
    "conv2d": CONV + LAYOUT,
    "conv2d_bias": CONV + (("activation", "str", REQUIRED),) + LAYOUT,
    "max_pool2d": POOL + LAYOUT,
    "max_pool2d_index": POOL + LAYOUT,
    "max_pool2d_grad": (("input_hw", "dims", REQUIRED),) + POOL + LAYOUT,
    "conv2d_input_grad": (("input_hw", "dims", REQUIRED),) + CONV + LAYOUT,
    "conv2d_weight_grad": (("kernel", "dims", REQUIRED),) + CONV + LAYOUT,
    "conv2d_weight_update": (("kernel", "dims", REQUIRED),) + CONV + (("subtract", "bool", False),) + LAYOUT,
}
LEAVES = ("input", "param")

ClassId = Any  # an egglog e-class id (bindings.Value): hashable, opaque


def _has_spec(node: Node) -> bool:
    spec = SPECS.get(node.op)
    if spec is None:
        return False
    names = {name for name, _, _ in spec}
    required = {name for name, _, default in spec if default is REQUIRED}
    given = set(node.attr_dict)
    return required <= given <= names


@dataclass
class Loaded:
    """What ``load`` put into the e-graph: leaves and opaque ops by index, root node indices."""

    graph: Graph
    leaves: list[Node]
    opaque: list[tuple[str, tuple]] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)  # indices of outputs then updates in graph.nodes


def load(egraph: EGraph, graph: Graph) -> Loaded:
    """Add the graph's nodes to ``egraph`` (``node(i)`` is node i's term), with shapes and dtypes."""
    loaded = Loaded(graph, list(graph.inputs + graph.params))
    rows, interned = graph_rows(graph, SPECS, _has_spec, loaded.leaves, loaded.opaque)
    load_rows(egraph, rows, interned)
    index = {n: i for i, n in enumerate(graph.nodes)}
    loaded.roots = [index[n] for n in graph.outputs] + [index[n] for _, n in graph.updates]
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


class _Decoder:
    """Values of a frozen e-graph as Python values, by egglog sort (literals memoized)."""

    def __init__(self, egraph: bindings.EGraph) -> None:
        self.egraph = egraph
        self.memo: dict[tuple[str, Any], Any] = {}

    def __call__(self, sort: str, value: Any) -> Any:
        if sort == TERM_SORT:
            return value
        key = (sort, value)
        if key not in self.memo:
            self.memo[key] = self._decode(sort, value)
        return self.memo[key]

    def _decode(self, sort: str, value: Any) -> Any:
        eg = self.egraph
        if sort == "bool":
            return eg.value_to_bool(value)
        if sort == "i64":
            return eg.value_to_i64(value)
        if sort == "f64":
            return eg.value_to_f64(value)
        if sort == "String":
            return eg.value_to_string(value)
        if sort == TERMS_SORT:
            return tuple(eg.value_to_vec(value))
        if sort == DIMS_SORT:
            return tuple(BATCH if d == BATCH_DIM else d for d in map(eg.value_to_i64, eg.value_to_vec(value)))
        raise TypeError(f"unexpected e-graph sort {sort!r}")


TERM_SORT = "mlir_nn.egraph.terms.Term"
TERMS_SORT = f"egglog.builtins.Vec[{TERM_SORT}]"
DIMS_SORT = "egglog.builtins.Vec[egglog.builtins.i64]"


def _constructors(egraph: EGraph) -> dict[str, str]:
    """egglog function name -> ``Term`` method name, for the constructors in use."""
    refs = egraph._state.callable_ref_to_egg_fn  # noqa: SLF001 (egglog 13's name table)
    return {name: ref.method_name for ref, (name, _) in refs.items()
            if isinstance(ref, ClassMethodRef) and ref.ident.name == Term.__name__}


def _enode(op: str, args: list[Any], loaded: Loaded) -> ENode:
    if op == "leaf":
        return ENode("leaf", (("index", args[0]),), ())
    if op == "const":
        return ENode("const", (("value", args[0]), ("dtype", args[1])), ())
    if op == "opaque":
        name, attrs = loaded.opaque[args[0]]
        return ENode(name, (("opaque", attrs),), tuple(args[1]))
    spec = SPECS[op]
    arity = len(args) - len(spec)
    attrs = tuple((name, value) for (name, _, default), value in zip(spec, args[arity:])
                  if value != default or default is REQUIRED)
    return ENode(op, attrs, tuple(args[:arity]))


def read_eclasses(egraph: EGraph, loaded: Loaded) -> EClasses:
    """Snapshot the Term e-classes, their shapes and the roots' e-classes."""
    raw = egraph._egraph  # noqa: SLF001 (the Rust e-graph's snapshot is ~100x faster than EGraph.freeze)
    frozen = raw.freeze()
    decode = _Decoder(raw)
    methods = _constructors(egraph)
    nodes: dict[ClassId, list[ENode]] = {}
    shapes: dict[ClassId, Shape] = {}
    by_index: dict[int, ClassId] = {}
    for name, function in frozen.functions.items():
        sorts = function.input_sorts
        if name in methods:
            op = methods[name]
            for row in function.rows:
                args = [decode(sort, v) for sort, v in zip(sorts, row.inputs)]
                nodes.setdefault(row.output, []).append(_enode(op, args, loaded))
        elif name == "mlirnn_node":
            by_index.update((raw.value_to_i64(row.inputs[0]), row.output) for row in function.rows)
        elif name == "mlir_nn_egraph_terms_shape":
            shapes.update((row.inputs[0], decode(DIMS_SORT, row.output)) for row in function.rows)
    return EClasses(nodes, shapes, [by_index[i] for i in loaded.roots])


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
