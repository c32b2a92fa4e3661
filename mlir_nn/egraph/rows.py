"""Bulk loading: a graph enters the e-graph as rows of per-op tables, not one command per node.

Egglog runs every top-level command as a small program of its own, so adding a graph one
command per node costs about a millisecond per node and grows with the e-graph. Here
every node becomes one row of integers in its op's relation (the node's index, its
operands' indices, keys of its attributes); the rows go to files that egglog's ``input``
command reads, and one rule per relation unions ``node(i)`` with the op's term. Attribute
values (dimension tuples, floats, flags, strings) are interned: a few ``set`` commands fill
one lookup table per kind, and the rows hold keys into them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Hashable
from functools import cache
from typing import Any

from egglog import (
    Bool,
    EGraph,
    RewriteOrRule,
    String,
    Vec,
    bindings,
    eq,
    f64,
    i64,
    relation,
    rule,
    ruleset,
    set_,
    union,
    var,
)
from egglog.egraph_state import span

from mlir_nn.egraph.terms import BATCH_DIM, Term, bool_attr, dims_attr, dtype, f64_attr, node, shape, str_attr
from mlir_nn.ir import Graph
from mlir_nn.ir.shapes import BATCH

LOOKUPS: dict[str, Callable[[Any], Any]] = {"dims": dims_attr, "f64": f64_attr, "bool": bool_attr, "str": str_attr}
LOOKUP_TYPES: dict[str, type] = {"dims": Vec[i64], "f64": f64, "bool": Bool, "str": String}


def dims_vec(dims: tuple) -> Vec[i64]:
    return Vec[i64](*(BATCH_DIM if d == BATCH else int(d) for d in dims))


class Interned:
    """Attribute values of one load, by kind: value -> key."""

    def __init__(self) -> None:
        self.keys: dict[str, dict[Hashable, int]] = {kind: {} for kind in LOOKUPS}

    def key(self, kind: str, value: Any) -> int:
        """The key of ``value`` (``kind`` "i64" is stored in the row itself)."""
        if kind == "i64":
            return int(value)
        value = tuple(value) if kind == "dims" else float(value) if kind == "f64" else \
            bool(value) if kind == "bool" else str(value)
        table = self.keys[kind]
        return table.setdefault(value, len(table))

    def commands(self) -> list:
        """``set`` actions that fill the lookup tables."""
        make = {"dims": dims_vec, "f64": float, "bool": bool, "str": str}
        return [set_(LOOKUPS[kind](k)).to(make[kind](value))
                for kind, table in self.keys.items() for value, k in table.items()]


class Rows:
    """The rows of one load, by table; each table has one loading rule."""

    def __init__(self) -> None:
        self.tables: dict[tuple, list[tuple[int, ...]]] = {}

    def add(self, table: tuple, row: tuple[int, ...]) -> None:
        self.tables.setdefault(table, []).append(row)


@cache
def _table(table: tuple) -> tuple[str, RewriteOrRule]:
    """(egglog name of the relation, its loading rule) for a table key:
    ("op", op, operands, attribute kinds), ("leaf",), ("const",), ("opaque", arity),
    ("shape",) or ("dtype",)."""
    kind = table[0]
    if kind == "op":
        _, op, arity, kinds = table
        width = 1 + arity + len(kinds)
    else:
        width = {"leaf": 2, "const": 3, "shape": 2, "dtype": 2}.get(kind) or 2 + table[1]
    name = "mlirnn_rows_" + "_".join(str(part) for part in table if not isinstance(part, tuple)) + \
        ("_" + "_".join(table[3]) if kind == "op" and table[3] else "")
    rows = relation(name, *([i64] * width), egg_fn=name)
    cols = [var(f"c{j}", i64) for j in range(width)]
    facts: list = [rows(*cols)]

    def looked_up(kind: str, key: i64) -> Any:
        """A query variable bound to ``key``'s value (egglog allows lookups only in queries)."""
        if kind == "i64":
            return key
        value = var(f"a{len(facts)}", LOOKUP_TYPES[kind])
        facts.append(eq(value).to(LOOKUPS[kind](key)))
        return value

    i = cols[0]
    if kind == "shape":
        action = set_(shape(node(i))).to(looked_up("dims", cols[1]))
    elif kind == "dtype":
        action = set_(dtype(node(i))).to(looked_up("str", cols[1]))
    else:
        action = union(node(i)).with_(_term(table, cols[1:], looked_up))
    return name, rule(*facts).then(action)


def _term(table: tuple, cols: list, looked_up: Callable[[str, Any], Any]) -> Term:
    kind = table[0]
    if kind == "leaf":
        return Term.leaf(cols[0])
    if kind == "const":
        return Term.const(looked_up("f64", cols[0]), looked_up("str", cols[1]))
    if kind == "opaque":
        args = [node(c) for c in cols[1:]]
        return Term.opaque(cols[0], Vec[Term](*args) if args else Vec[Term].empty())
    _, op, arity, kinds = table
    operands = [node(c) for c in cols[:arity]]
    attrs = [looked_up(k, c) for k, c in zip(kinds, cols[arity:])]
    return getattr(Term, op)(*operands, *attrs)


def load_rows(egraph: EGraph, rows: Rows, interned: Interned) -> None:
    """Fill the lookup tables, read every table's rows and run the loading rules once."""
    commands = interned.commands()
    if commands:
        egraph.register(*commands)
    names_rules = [(_table(table), table) for table in rows.tables]
    load = ruleset(*(r for (_, r), _ in names_rules))
    egraph.run(load)  # declares the relations (no rows yet: matches nothing)
    with tempfile.TemporaryDirectory(prefix="mlirnn-rows-") as folder:
        inputs = []
        for (name, _), table in names_rules:
            path = os.path.join(folder, name + ".tsv")
            with open(path, "w") as f:
                f.write("".join("\t".join(map(str, row)) + "\n" for row in rows.tables[table]))
            inputs.append(bindings.Input(span(), name, path))
        egraph._egraph.run_program(*inputs)  # noqa: SLF001 (egglog has no Python form of `input`)
    egraph.run(load)


def graph_rows(graph: Graph, specs: dict, has_spec: Callable, leaves: list, opaque: list) -> tuple[Rows, Interned]:
    """One row per node of ``graph`` (plus its shape and dtype rows); ``opaque`` collects
    (op, attrs) of nodes without a constructor, in key order."""
    rows, interned = Rows(), Interned()
    leaf_index = {n: i for i, n in enumerate(leaves)}
    index = {n: i for i, n in enumerate(graph.nodes)}
    for i, n in enumerate(graph.nodes):
        args = tuple(index[x] for x in n.inputs)
        if n.op in ("input", "param"):
            rows.add(("leaf",), (i, leaf_index[n]))
        elif n.op == "const":
            rows.add(("const",), (i, interned.key("f64", n.attr("value")), interned.key("str", n.dtype)))
        elif has_spec(n):
            attrs = n.attr_dict
            spec = specs[n.op]
            kinds = tuple(kind for _, kind, _ in spec)
            keys = tuple(interned.key(kind, attrs.get(name, default)) for name, kind, default in spec)
            rows.add(("op", n.op, len(args), kinds), (i, *args, *keys))
        else:
            opaque.append((n.op, n.attrs))
            rows.add(("opaque", len(args)), (i, len(opaque) - 1, *args))
        rows.add(("shape",), (i, interned.key("dims", n.shape)))
        rows.add(("dtype",), (i, interned.key("str", n.dtype)))
    return rows, interned
