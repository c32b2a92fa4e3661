"""Product results written through the copy that moves them: a convolution's rows stored as NCHW.

A convolution's product gives one row per output pixel, ``C (N * P * Q, O)``; the shared
codegen then views it as ``(N, P, Q, O)`` (``memref.expand_shape``) and copies it to NCHW
with one all-parallel ``linalg.generic`` whose read map is a permutation, and a fused
convolution adds its bias and ReLU in place on that NCHW buffer. ``find_scatter``
recognizes the copy (and such an element-wise epilogue right after it) when nothing else
reads C; the register-tiled kernel (``mlir_nn.gpu.matmul``) then stores element ``(m, n)``
straight to ``D[perm(delinearize(m, n))]``, the epilogue applied in registers, and
``Scatter.erase`` removes the copy, the epilogue and C. A weight gradient's result is
instead viewed as the weight's shape and updated in place by a folded update
(``beta * w +- alpha * dW``): that epilogue is applied in registers the same way, C kept.
The ops that define D and the epilogue's operands (allocations, views, sizes) are moved
before the product.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir.dialects import arith, memref
from mlir.ir import AffineConstantExpr, AffineDimExpr, AffineMapAttr, ArrayAttr, IndexType, MemRefType, Operation, Value

from mlir_nn.gpu.gathers import root, written
from mlir_nn.gpu.schedule import clone_body, iterator_kinds

HOISTABLE = ("memref.alloc", "memref.expand_shape", "memref.collapse_shape", "memref.cast", "memref.dim",
             "arith.constant", "arith.muli", "arith.addi")


@dataclass
class Scatter:
    """C viewed as ``view`` equals ``dest`` read at ``order``: view dim k is dest dim ``order[k]``."""

    c: Operation  # memref.alloc of the product's result
    view: Operation  # memref.expand_shape of C
    copy: Operation | None  # None: C is updated in place through the view by the epilogue, and kept
    dest: Value
    order: list[int]
    groups: list[list[int]]
    epilogue: Operation | None  # element-wise on dest, right after the copy

    def store(self, value: Value, m: Value, n: Value) -> None:
        """Store C's element ``(m, n)`` (inside C) at its place in ``dest``, through the epilogue."""
        t = MemRefType(self.view.results[0].type)
        at: list[Value] = []
        for flat, group in zip((m, n), self.groups):
            parts = []
            for d in reversed(group[1:]):
                extent = arith.constant(IndexType.get(), t.shape[d])
                parts.append(arith.remui(flat, extent))
                flat = arith.divui(flat, extent)
            at += [flat, *reversed(parts)]
        index: list[Value] = [at[0]] * len(at)
        for k, d in enumerate(self.order):
            index[d] = at[k]
        if self.epilogue is not None:
            value = _apply(self.epilogue, index, value)
        memref.store(value, self.dest, index)

    def erase(self) -> None:
        """Remove the copy, the epilogue and C (call once the product's kernel replaced its ops);
        without a copy, the epilogue only."""
        if self.copy is None:
            self.epilogue.erase()
            return
        for op in (self.epilogue, self.copy, self.view):
            if op is not None:
                op.erase()
        for use in list(self.c.results[0].uses):
            use.owner.operation.erase()  # deallocs
        self.c.erase()


def _apply(op: Operation, index: list[Value], out: Value) -> Value:
    """Clone the element-wise ``op``'s body for element ``index`` with ``out`` = ``out``."""
    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    mapping: dict[Value, Value] = {args[-1]: out}
    dest = op.operands[len(args) - 1]
    for arg, operand, attr in zip(args[:-1], list(op.operands)[:-1], ArrayAttr(op.attributes["indexing_maps"])):
        if operand == dest:
            mapping[arg] = out
        elif isinstance(operand.type, MemRefType):
            at = [index[e.position] if isinstance(e, AffineDimExpr) else arith.constant(IndexType.get(), e.value)
                  for e in (r.maybe_downcast() for r in AffineMapAttr(attr).value.results)]
            mapping[arg] = memref.load(operand, at)
        else:
            mapping[arg] = operand
    return clone_body(block, mapping)


def _owner(v: Value) -> Operation | None:
    owner = v.owner
    return owner.operation if hasattr(owner, "operation") else None


def _permutation(attr: AffineMapAttr) -> list[int] | None:
    m = AffineMapAttr(attr).value
    out = []
    for e in m.results:
        e = e.maybe_downcast()
        if not isinstance(e, AffineDimExpr):
            return None
        out.append(e.position)
    return out if sorted(out) == list(range(m.n_dims)) else None


def _pure_copy(op: Operation) -> bool:
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    return len(body) == 1 and body[0].operands[0] == op.regions[0].blocks[0].arguments[0]


def _is_epilogue(op: Operation, dest: Value) -> bool:
    """All-parallel over dest, writes it at the identity and reads it there only (through ``outs`` or
    an input at the identity); other operands are read at dims or constants (broadcasts)."""
    if op.name != "linalg.generic" or "reduction" in iterator_kinds(op):
        return False
    n_in, n_out = list(op.attributes["operandSegmentSizes"])
    maps = list(ArrayAttr(op.attributes["indexing_maps"]))
    identity = list(range(len(maps[n_in].value.results)))
    if n_out != 1 or op.operands[n_in] != dest or _permutation(maps[n_in]) != identity:
        return False
    for v, attr in zip(list(op.operands)[:n_in], maps):
        if v == dest:
            if _permutation(attr) != identity:
                return False
        elif (isinstance(v.type, MemRefType)
                         and any(not isinstance(e.maybe_downcast(), AffineDimExpr | AffineConstantExpr)
                                 for e in AffineMapAttr(attr).value.results)):
            return False
    return True


def _hoist(v: Value, before: Operation, block_ops: list[Operation], limit: int, moves: list[Operation]) -> bool:
    """Whether ``v`` is (or can be made, by moving allocations, views and size arithmetic) defined
    before ``block_ops[limit]``; the ops to move, in order, are appended to ``moves``."""
    owner = _owner(v)
    if owner is None or (owner in block_ops and block_ops.index(owner) < limit) or owner in moves:
        return True
    if owner.name not in HOISTABLE or owner not in block_ops:
        return False
    if not all(_hoist(o, before, block_ops, limit, moves) for o in owner.operands):
        return False
    moves.append(owner)
    return True


def _unchanged(epilogue: Operation, block_ops: list[Operation], start: int) -> bool:
    """Nothing between ``block_ops[start]`` and the epilogue writes what the epilogue reads (but the
    result it updates)."""
    n_in, _ = list(epilogue.attributes["operandSegmentSizes"])
    out = root(epilogue.operands[n_in])
    reads = {root(v) for v in list(epilogue.operands)[:n_in] if isinstance(v.type, MemRefType)} - {out}
    between = block_ops[start + 1:block_ops.index(epilogue)]
    return not any(r in written(op) for op in between for r in reads if op != epilogue)


def find_scatter(c: Value, contraction: Operation, product_ops: list[Operation],
                 block_ops: list[Operation]) -> tuple[Scatter, list[Operation]] | None:
    """The copy that moves the product's result ``c`` (see the module docstring) and the ops to move
    before the product for its kernel to store there, or None."""
    alloc = _owner(c)
    if alloc is None or alloc.name != "memref.alloc" or contraction not in block_ops:
        return None
    users = [u.owner.operation for u in c.uses]
    views = [u for u in users if u.name == "memref.expand_shape"]
    if len(views) != 1 or any(u not in product_ops and u.name != "memref.dealloc" and u != views[0] for u in users):
        return None
    view = views[0]
    groups = [[int(d) for d in g] for g in ArrayAttr(view.attributes["reassociation"])]
    t = MemRefType(view.results[0].type)
    if len(groups) != 2 or any(t.is_dynamic_dim(d) for g in groups for d in g[1:]):
        return None
    readers = [u.owner.operation for u in view.results[0].uses]
    if any(r not in block_ops for r in readers):
        return None
    at = block_ops.index(contraction)
    first = min(readers, key=block_ops.index) if readers else None
    if first is not None and _is_epilogue(first, view.results[0]):  # updated in place, read later as it is
        moves: list[Operation] = []
        hoisted = all(_hoist(v, contraction, block_ops, at, moves) for v in first.operands)
        if not _unchanged(first, block_ops, at) or not hoisted:
            return None
        return Scatter(alloc, view, None, view.results[0], list(range(t.rank)), groups, first), moves
    if len(readers) != 1 or readers[0].name != "linalg.generic":
        return None
    copy = readers[0]
    if len(copy.operands) != 2 or copy.operands[0] != view.results[0] or not _pure_copy(copy):
        return None
    if any("parallel" not in str(k) for k in ArrayAttr(copy.attributes["iterator_types"])):
        return None
    read, write = (_permutation(a) for a in ArrayAttr(copy.attributes["indexing_maps"]))
    if read is None or write != list(range(len(write))):
        return None
    dest = copy.operands[1]
    start = block_ops.index(copy)
    if any(block_ops.index(u.owner.operation) < start for u in dest.uses
           if u.owner.operation in block_ops and u.owner.operation.name not in HOISTABLE):
        return None
    following = [o for o in block_ops[start + 1:] if o.name.startswith("linalg.")]
    epilogue = following[0] if following and _is_epilogue(following[0], dest) else None
    if epilogue is not None and not _unchanged(epilogue, block_ops, at):
        epilogue = None
    moves: list[Operation] = []
    needed = [dest] + (list(epilogue.operands)[:-1] if epilogue is not None else [])
    if not all(_hoist(v, contraction, block_ops, at, moves) for v in needed):
        return None
    return Scatter(alloc, view, copy, dest, read, groups, epilogue), moves
