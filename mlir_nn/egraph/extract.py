"""DAG-aware extraction: choose one e-node per e-class so the whole program is cheapest.

A shared sub-term is paid for once, however many users it has. Extraction starts from
the best tree (each e-class's cheapest e-node, children included), then improves it by
local search on the true DAG cost: switch one e-class's choice at a time (re-choosing the
e-classes the switch brings into the program where that pays, one level deep) and keep the
switch when the program reachable from the roots gets cheaper and stays acyclic.

Both phases grow about linearly with the e-graph, so deep chains (hundreds of layers)
extract in well under a second:
- the best tree is found in one pass, cheapest first (Knuth's generalization of
  Dijkstra's algorithm): an e-node is priced once every child has its final cost;
- a switch is priced by what it changes, not by walking the whole program again:
  use counts say which e-classes become reachable or unreachable;
- a switch that would close a cycle is found by a search that stays above the switched
  e-class in a topological numbering of the current choice (``Levels``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable

from mlir_nn.egraph.convert import ClassId, EClasses, ENode

Choice = dict[ClassId, ENode]


def tree_choice(eclasses: EClasses, cost: dict[ENode, float]) -> tuple[Choice, list[ClassId]]:
    """(each e-class's e-node of least tree cost, the e-classes in the order they were
    settled: children before users). E-classes only reachable through cycles get none."""
    waiting: list[int] = []  # per candidate: children not settled yet
    candidates: list[tuple[ClassId, ENode]] = []
    users: dict[ClassId, list[int]] = {}
    heap: list[tuple[float, int]] = []
    for cid, enodes in eclasses.nodes.items():
        for enode in enodes:
            if enode not in cost:
                continue
            k = len(candidates)
            candidates.append((cid, enode))
            children = set(enode.children)
            waiting.append(len(children))
            for child in children:
                users.setdefault(child, []).append(k)
            if not children:
                heapq.heappush(heap, (cost[enode], k))
    best: dict[ClassId, float] = {}
    choice: Choice = {}
    order: list[ClassId] = []
    while heap:
        total, k = heapq.heappop(heap)
        cid, enode = candidates[k]
        if cid in best:
            continue
        best[cid], choice[cid] = total, enode
        order.append(cid)
        for user in users.get(cid, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                ucid, uenode = candidates[user]
                if ucid not in best:
                    heapq.heappush(heap, (cost[uenode] + sum(best[c] for c in uenode.children), user))
    return choice, order


def dag_cost(roots: list[ClassId], choice: Choice, cost: dict[ENode, float]) -> tuple[float, list[ClassId]]:
    """(cost of the program reachable from ``roots``, its e-classes users first); inf if cyclic."""
    state: dict[ClassId, int] = {}  # 1: on the DFS path, 2: done
    done: list[ClassId] = []
    total = 0.0
    for root in roots:
        stack = [(root, False)]
        while stack:
            cid, leaving = stack.pop()
            if leaving:
                state[cid] = 2
                done.append(cid)
                continue
            seen = state.get(cid)
            if seen == 2:
                continue
            if seen == 1:
                return math.inf, []
            enode = choice.get(cid)
            if enode is None:
                return math.inf, []
            state[cid] = 1
            total += cost[enode]
            stack.append((cid, True))
            for child in enode.children:
                if state.get(child) == 1:
                    return math.inf, []
                if state.get(child) is None:
                    stack.append((child, False))
    return total, done[::-1]


class Levels:
    """A topological numbering of the chosen e-nodes' edges (a user's level is above its
    children's), kept valid as choices change; it bounds the search for cycles."""

    def __init__(self, choice: Choice, settled: list[ClassId]) -> None:
        self.choice = choice
        self.level = {cid: i for i, cid in enumerate(settled)}  # children were settled first
        self.users: dict[ClassId, dict[ClassId, int]] = {}
        for cid in settled:
            self._link(cid, choice[cid].children, 1)

    def _link(self, cid: ClassId, children: Iterable[ClassId], step: int) -> None:
        for child in children:
            users = self.users.setdefault(child, {})
            users[cid] = users.get(cid, 0) + step
            if not users[cid]:
                del users[cid]

    def would_cycle(self, cid: ClassId, enode: ENode) -> bool:
        """Whether choosing ``enode`` for ``cid`` closes a cycle through the current choice."""
        floor = self.level[cid]
        stack = [c for c in enode.children if self.level[c] >= floor]
        seen: set[ClassId] = set()
        while stack:
            c = stack.pop()
            if c == cid:
                return True
            if c in seen:
                continue
            seen.add(c)
            stack.extend(g for g in self.choice[c].children if self.level[g] >= floor)
        return False

    def switch(self, cid: ClassId, old: ENode, new: ENode) -> None:
        """Record that ``cid`` now uses ``new`` (already in the choice) instead of ``old``."""
        self._link(cid, old.children, -1)
        self._link(cid, new.children, 1)
        level = self.level
        stack = [cid]
        while stack:  # raise users above their children wherever the switch broke the order
            c = stack.pop()
            floor = max((level[g] for g in self.choice[c].children), default=-1)
            if level[c] <= floor:
                level[c] = floor + 1
            stack.extend(u for u in self.users.get(c, ()) if level[u] <= level[c])


class Program:
    """The program reachable from the roots under a choice, with use counts, so a switch
    is priced by the e-classes it brings in and leaves behind."""

    def __init__(self, roots: list[ClassId], choice: Choice, cost: dict[ENode, float]) -> None:
        self.choice, self.cost = choice, cost
        self.uses: dict[ClassId, int] = {}
        self.total = 0.0
        self.total += self._use(roots, 1)

    def reachable(self, cid: ClassId) -> bool:
        return self.uses.get(cid, 0) > 0

    def _use(self, classes: Iterable[ClassId], step: int) -> float:
        """Add ``step`` (+1 or -1) uses to ``classes``; the cost that enters (or leaves) the program."""
        delta = 0.0
        stack = list(classes)
        uses, choice, cost = self.uses, self.choice, self.cost
        while stack:
            c = stack.pop()
            before = uses.get(c, 0)
            uses[c] = before + step
            if (step > 0 and before == 0) or (step < 0 and before == 1):
                enode = choice[c]
                delta += step * cost[enode]
                stack.extend(enode.children)
        return delta

    def switch(self, cid: ClassId, new: ENode) -> float:
        """Choose ``new`` for the reachable ``cid``; the change of the program's cost."""
        old = self.choice[cid]
        self.choice[cid] = new
        delta = self.cost[new] - self.cost[old] + self._use(new.children, 1) + self._use(old.children, -1)
        self.total += delta
        return delta


def _improve_children(eclasses: EClasses, cost: dict[ENode, float], program: Program, levels: Levels,
                      fresh: list[ClassId]) -> list[tuple[ClassId, ENode, ENode]]:
    """After a switch, re-choose each e-class it brought into the program where that is cheaper now
    (a look-ahead of one level: unfusing ``relu(conv2d_bias(x, W, b))`` pays only once the
    convolution it brings in is the shared ``conv2d(x, W)``); the switches made, as (e-class, old, new)."""
    made = []
    for child in fresh:
        for enode in eclasses.nodes[child]:
            old = program.choice[child]
            if (enode == old or enode not in cost or not program.reachable(child)
                    or not all(c in program.choice for c in enode.children) or levels.would_cycle(child, enode)):
                continue
            if program.switch(child, enode) < 0:
                levels.switch(child, old, enode)
                made.append((child, old, enode))
            else:
                program.switch(child, old)
    return made


def extract(eclasses: EClasses, node_cost: Callable[[ClassId, ENode], float | None],
            max_sweeps: int = 4) -> tuple[Choice, float]:
    """Cheapest program for ``eclasses.roots``; ``node_cost`` is None for e-nodes to avoid."""
    cost = {}
    for cid, enodes in eclasses.nodes.items():
        for enode in enodes:
            c = node_cost(cid, enode)
            if c is not None:
                cost[enode] = c
    choice, settled = tree_choice(eclasses, cost)
    if any(root not in choice for root in eclasses.roots):
        raise ValueError("extraction found no acyclic program for the roots")
    levels = Levels(choice, settled)
    program = Program(eclasses.roots, choice, cost)
    for _ in range(max_sweeps):
        improved = False
        _, order = dag_cost(eclasses.roots, choice, cost)
        for cid in order:  # users before the values they use
            for enode in eclasses.nodes[cid]:
                old = choice[cid]
                if (enode == old or enode not in cost or not program.reachable(cid)
                        or not all(c in choice for c in enode.children) or levels.would_cycle(cid, enode)):
                    continue
                before = program.total
                fresh = [c for c in enode.children if not program.reachable(c)]
                program.switch(cid, enode)
                levels.switch(cid, old, enode)
                children = _improve_children(eclasses, cost, program, levels, fresh)
                if program.total < before - 1e-12 * before:
                    improved = True
                    continue
                for child, child_old, child_new in reversed(children):
                    program.switch(child, child_old)
                    levels.switch(child, child_new, child_old)
                program.switch(cid, old)
                levels.switch(cid, enode, old)
                program.total = before
        if not improved:
            break
    total, reachable = dag_cost(eclasses.roots, choice, cost)
    return {cid: choice[cid] for cid in reachable}, total
