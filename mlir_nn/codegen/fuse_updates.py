"""Element-wise chains over buffers fused into one pass (run after bufferization).

An optimizer's update is a chain of element-wise ``linalg.generic`` ops over buffers of one
parameter's shape: Adam writes m in place, then v in place, then reads both to write the
parameter in place. Each op is a pass over memory; fused they are one pass that reads every
buffer once and writes m, v and the parameter where they are (no copy of any of them).

Tensor-level fusion (``linalg-fuse-elementwise-ops``) leaves these apart because m and v
have two users each (their own update and the parameter's), and fusing on tensors before
bufferization makes it copy the parameter. Here a generic G is sunk into a later generic H
over the same static domain when:

* every operand of both is read or written through the identity map, or read whole as a
  0-d buffer (a scalar);
* the ops between them neither write a buffer G reads or writes, nor read a buffer G writes;
* H reads G's outputs only element by element and writes no buffer G writes.

The fused op computes G's body, then H's with G's new values in place of H's reads of them,
and writes the outputs of both.
"""

from __future__ import annotations

from functools import cached_property

from mlir import ir

from mlir_nn.codegen import linalg_ops as linalg

_VIEWS = frozenset(
    {
        "memref.subview",
        "memref.cast",
        "memref.reinterpret_cast",
        "memref.collapse_shape",
        "memref.expand_shape",
        "memref.view",
    }
)


def _root(value: ir.Value) -> ir.Value:
    """The buffer a view was taken of (the value itself when it is no view)."""
    while not isinstance(value.owner, ir.Block) and value.owner.name in _VIEWS:
        value = value.owner.operands[0]
    return value


def _is_memref(value: ir.Value) -> bool:
    return isinstance(value.type, ir.MemRefType)


class _Ewise:
    """An element-wise generic over buffers, or a chain of them to be fused (``members``, in
    order): its inputs and outputs with their maps, as the one fused op will have them."""

    def __init__(self, op: ir.Operation) -> None:
        self.members = [op]
        n_in = len(op.opview.inputs)
        self.ins = list(op.operands)[:n_in]
        self.outs = list(op.operands)[n_in:]
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
        self.in_maps, self.out_maps = maps[:n_in], maps[n_in:]

    @property
    def op(self) -> ir.Operation:
        """The last member: where the fused op goes."""
        return self.members[-1]

    @cached_property
    def writes(self) -> frozenset[ir.Value]:
        """The buffers it writes (worked out once: the scan asks for every op it passes)."""
        return frozenset(_root(v) for v in self.outs)

    @cached_property
    def reads(self) -> frozenset[ir.Value]:
        return frozenset(_root(v) for v in self.ins)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(ir.MemRefType(self.outs[0].type).shape)


def _elementwise(op: ir.Operation) -> _Ewise | None:
    """``op`` as an element-wise generic over static buffers of one shape, or None."""
    if op.name != "linalg.generic" or op.results:
        return None
    kinds = [str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"])]
    if not kinds or any("parallel" not in k for k in kinds):
        return None
    e = _Ewise(op)
    if not e.outs or not all(_is_memref(v) for v in e.ins + e.outs):
        return None
    shape = ir.MemRefType(e.outs[0].type).shape
    if any(ir.ShapedType(e.outs[0].type).is_dynamic_dim(i) for i in range(len(shape))):
        return None
    for value, amap in zip(e.ins + e.outs, e.in_maps + e.out_maps):
        kind = ir.MemRefType(value.type)
        whole = amap.is_permutation and list(amap.results) == [ir.AffineExpr.get_dim(i) for i in range(len(kind.shape))]
        if whole and list(kind.shape) == list(shape):
            continue
        if value in e.ins and kind.rank == 0 and len(amap.results) == 0:
            continue
        return None
    return e


def _touched(op: ir.Operation) -> tuple[set[ir.Value], set[ir.Value]]:
    """(buffers read, buffers written) by ``op``; any other memref use counts as both."""
    if op.name.startswith("linalg.") and "operandSegmentSizes" in op.attributes:
        n_in = len(op.opview.inputs)
        operands = list(op.operands)
        return (
            {_root(v) for v in operands[:n_in] if _is_memref(v)},
            {_root(v) for v in operands[n_in:] if _is_memref(v)},
        )
    if op.name == "memref.copy":
        return {_root(op.operands[0])}, {_root(op.operands[1])}
    used: set[ir.Value] = set()

    def visit(inner: ir.Operation) -> ir.WalkResult:
        used.update(_root(v) for v in inner.operands if _is_memref(v))
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return used, used


def _fusable(g: _Ewise, h: _Ewise) -> bool:
    if g.shape != h.shape or g.writes & h.writes:
        return False
    written = g.writes
    for value, amap in zip(h.ins, h.in_maps):  # G's outputs are read element by element, as G wrote them
        if _root(value) in written and (len(amap.results) == 0 or value not in g.outs):
            return False
    return not h.writes & {_root(v) for v, m in zip(g.ins, g.in_maps) if len(m.results) == 0}


def _joined(g: _Ewise, h: _Ewise) -> _Ewise:
    """G sunk into H, not built yet: the members of both, the inputs of G then those of H that G
    does not write (each (buffer, map) once), the outputs of both."""
    joined = object.__new__(_Ewise)
    joined.members = g.members + h.members
    # (maps are uniqued in their context and hashable: printing each to compare took 3-7 us)
    unread = [(v, m) for v, m in zip(h.ins, h.in_maps) if v not in g.outs]
    operands = dict.fromkeys(list(zip(g.ins, g.in_maps)) + unread)
    joined.ins = [value for value, _ in operands]
    joined.in_maps = [amap for _, amap in operands]
    joined.outs, joined.out_maps = g.outs + h.outs, g.out_maps + h.out_maps
    return joined


def _materialize(chain: _Ewise) -> None:
    """One generic at the last member's place computing every member in turn, each reading the
    values the members before it computed for the buffers they write; the members' bodies are
    moved into it, not copied, and the members erased."""
    last = chain.op
    with last.context, last.location, ir.InsertionPoint(last):
        fused = linalg.GenericOp(
            [],
            chain.ins,
            chain.outs,
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in chain.in_maps + chain.out_maps]),
            last.attributes["iterator_types"],
        )
        block = fused.regions[0].blocks.append(*[ir.MemRefType(v.type).element_type for v in chain.ins + chain.outs])
    position = {operand: i for i, operand in enumerate(zip(chain.ins, chain.in_maps))}
    computed: dict[ir.Value, ir.Value] = {}  # buffer -> its new value in the fused body
    yielded: list[ir.Value] = []
    out_base = len(chain.ins)
    for member in chain.members:
        part = _Ewise(member)
        old = member.regions[0].blocks[0]
        arguments = list(old.arguments)
        for arg, value, amap in zip(arguments, part.ins, part.in_maps):
            new = computed[value] if value in computed else block.arguments[position[(value, amap)]]
            arg.replace_all_uses_with(new)
        for k, arg in enumerate(arguments[len(part.ins):]):
            arg.replace_all_uses_with(block.arguments[out_base + k])
        out_base += len(part.outs)
        for inner in list(old.operations):
            if inner.name == "linalg.yield":
                values = list(inner.operands)
                computed.update(zip(part.outs, values))
                yielded.extend(values)
                break
            block.append(inner)
    with last.context, last.location, ir.InsertionPoint(block):
        linalg.YieldOp(yielded)
    for member in chain.members:
        member.erase()


class _Scanned:
    """A block's ops in order, each with its element-wise view and the buffers it touches,
    worked out once (not again for every candidate pair)."""

    def __init__(self, block: ir.Block) -> None:
        self.ops = list(block.operations)
        self._ewise: list[_Ewise | None | bool] = [False] * len(self.ops)  # False: not worked out yet
        self._touched: list[tuple[set[ir.Value], set[ir.Value]] | None] = [None] * len(self.ops)

    def ewise(self, i: int) -> _Ewise | None:
        if self._ewise[i] is False:
            self._ewise[i] = _elementwise(self.ops[i])
        return self._ewise[i]  # type: ignore[return-value]

    def touched(self, i: int) -> tuple[set[ir.Value], set[ir.Value]]:
        if self._touched[i] is None:
            self._touched[i] = _touched(self.ops[i])
        return self._touched[i]  # type: ignore[return-value]

    def chains(self) -> list[_Ewise]:
        """The chains of more than one op."""
        return [e for e in self._ewise if isinstance(e, _Ewise) and len(e.members) > 1]

    def replace(self, i: int, j: int, chain: _Ewise) -> None:
        """Op ``i`` was sunk into op ``j``: ``chain`` (both, built at the end) stands at j, i is gone."""
        for column in (self.ops, self._ewise, self._touched):
            del column[i]
        j -= 1
        self.ops[j], self._ewise[j], self._touched[j] = chain.op, chain, (set(chain.reads), set(chain.writes))


def _fuse_in_block(block: ir.Block) -> int:
    """Sink each element-wise generic into the next one that reads what it wrote (when no op
    in between touches what it reads or writes); the count fused. One pass: a chain is
    visited again when the scan reaches its place; each chain's op is built once, at the end
    (building the op of every step of a chain took two thirds of this pass's time)."""
    scanned = _Scanned(block)
    fused = 0
    i = 0
    while i < len(scanned.ops):
        g = scanned.ewise(i)
        target = None
        used = g.reads | g.writes if g is not None else frozenset()
        for j in range(i + 1, len(scanned.ops)) if g is not None else ():
            h = scanned.ewise(j)
            if h is not None and not g.writes.isdisjoint(h.reads):
                target = j if _fusable(g, h) else None
                break
            reads, writes = scanned.touched(j)
            if not writes.isdisjoint(used) or not reads.isdisjoint(g.writes):
                break  # G cannot move past this op
        if target is None:
            i += 1
            continue
        scanned.replace(i, target, _joined(g, scanned.ewise(target)))
        fused += 1
    for chain in scanned.chains():
        _materialize(chain)
    return fused


def fuse_elementwise_chains(module: ir.Module) -> int:
    """Fuse element-wise chains in the top-level blocks of the module's functions; the count fused."""
    total = 0
    for fn in module.body.operations:
        if fn.operation.name == "func.func" and fn.regions[0].blocks:
            total += _fuse_in_block(fn.regions[0].blocks[0])
    return total
