"""The earlier extractor, kept as a test oracle for ``mlir_nn.egraph.extract``.

It prices every candidate switch by walking the whole program again (quadratic in the
program's size), which makes it slow on deep chains but simple enough to trust.

A shared sub-term is paid for once, however many users it has. Extraction starts from
the best tree (each e-class's cheapest e-node, children included, found by a fixpoint
that never closes a cycle), then improves it by local search on the true DAG cost:
switch one e-class's choice at a time and keep the switch when the program reachable
from the roots gets cheaper and stays acyclic.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mlir_nn.egraph.convert import ClassId, EClasses, ENode
from mlir_nn.egraph.extract import dag_cost

Choice = dict[ClassId, ENode]


def tree_choice(eclasses: EClasses, cost: dict[ENode, float]) -> Choice:
    """Each e-class's e-node of least tree cost (a fixpoint; cycles never get finite cost)."""
    best: dict[ClassId, float] = {}
    choice: Choice = {}
    changed = True
    while changed:
        changed = False
        for cid, enodes in eclasses.nodes.items():
            for enode in enodes:
                if enode not in cost or not all(c in best for c in enode.children):
                    continue
                total = cost[enode] + sum(best[c] for c in enode.children)
                if total < best.get(cid, math.inf) * (1 - 1e-12):
                    best[cid], choice[cid] = total, enode
                    changed = True
    return choice


def extract(eclasses: EClasses, node_cost: Callable[[ClassId, ENode], float | None],
            max_sweeps: int = 4) -> tuple[Choice, float]:
    """Cheapest program for ``eclasses.roots``; ``node_cost`` is None for e-nodes to avoid."""
    cost = {}
    for cid, enodes in eclasses.nodes.items():
        for enode in enodes:
            c = node_cost(cid, enode)
            if c is not None:
                cost[enode] = c
    choice = tree_choice(eclasses, cost)
    current, reachable = dag_cost(eclasses.roots, choice, cost)
    if math.isinf(current):
        raise ValueError("extraction found no acyclic program for the roots")
    for _ in range(max_sweeps):
        improved = False
        for cid in list(reachable):  # users before the values they use
            if choice.get(cid) is None:
                continue
            for enode in eclasses.nodes[cid]:
                old = choice[cid]
                if enode == old or enode not in cost or not all(c in choice for c in enode.children):
                    continue
                choice[cid] = enode
                total, now_reachable = dag_cost(eclasses.roots, choice, cost)
                if total < current * (1 - 1e-12):
                    current, reachable, improved = total, now_reachable, True
                else:
                    choice[cid] = old
        if not improved:
            break
    return {cid: choice[cid] for cid in reachable}, current
