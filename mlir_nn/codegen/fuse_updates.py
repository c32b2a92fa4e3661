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
    """An element-wise generic over buffers: its inputs and outputs with their maps."""

    def __init__(self, op: ir.Operation) -> None:
        self.op = op
        n_in = len(op.opview.inputs)
        self.ins = list(op.operands)[:n_in]
        self.outs = list(op.operands)[n_in:]
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
        self.in_maps, self.out_maps = maps[:n_in], maps[n_in:]

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


def _fuse(g: _Ewise, h: _Ewise) -> ir.Operation:
    """One generic at H's place computing G then H."""
    replaced = {value for value in h.ins if value in g.outs}
    # (maps are uniqued, hashed and compared as such: printing each, as a key, took 7 us, and most of
    # the fusions' time at 16x64 Adam)
    operands = list(dict.fromkeys(list(zip(g.ins, g.in_maps)) + [(v, m) for v, m in zip(h.ins, h.in_maps)
                                                                   if v not in replaced]))
    outs = list(zip(g.outs, g.out_maps)) + list(zip(h.outs, h.out_maps))
    with h.op.context, h.op.location, ir.InsertionPoint(h.op):
        fused = linalg.GenericOp(
            [],
            [v for v, _ in operands],
            [v for v, _ in outs],
            ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for _, m in operands + outs]),
            h.op.attributes["iterator_types"],
        )
        types = [ir.MemRefType(v.type).element_type for v, _ in operands + outs]
        block = fused.regions[0].blocks.append(*types)
        position = {operand: i for i, operand in enumerate(operands)}
        yielded: list[ir.Value] = []
        g_new: dict[ir.Value, ir.Value] = {}
        for part, out_base in ((g, 0), (h, len(g.outs))):
            old = part.op.regions[0].blocks[0]
            mapping: dict[ir.Value, ir.Value] = {}
            for arg, value, amap in zip(list(old.arguments), part.ins, part.in_maps):
                mapping[arg] = (
                    g_new[value] if part is h and value in replaced else block.arguments[position[(value, amap)]]
                )
            for k, arg in enumerate(list(old.arguments)[len(part.ins) :]):
                mapping[arg] = block.arguments[len(operands) + out_base + k]
            with ir.InsertionPoint(block):
                for inner in old.operations:
                    if inner.name == "linalg.yield":
                        values = [mapping.get(v, v) for v in inner.operands]
                        if part is g:
                            g_new.update(zip(g.outs, values))
                        yielded.extend(values)
                        continue
                    copy = inner.clone()
                    for i, v in enumerate(copy.operands):
                        if v in mapping:
                            copy.operands[i] = mapping[v]
                    mapping.update(zip(inner.results, copy.results))
        with ir.InsertionPoint(block):
            linalg.YieldOp(yielded)
    g.op.erase()
    h.op.erase()
    return fused.operation


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

    def replace(self, i: int, j: int, fused: ir.Operation) -> None:
        """Op ``i`` was fused into op ``j``: ``fused`` stands at j, i is gone."""
        for column in (self.ops, self._ewise, self._touched):
            del column[i]
        j -= 1
        self.ops[j], self._ewise[j], self._touched[j] = fused, False, None


def _fuse_in_block(block: ir.Block) -> int:
    """Sink each element-wise generic into the next one that reads what it wrote (when no op
    in between touches what it reads or writes); the count fused. One pass: a fused op is
    visited again when the scan reaches its place."""
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
        scanned.replace(i, target, _fuse(g, scanned.ewise(target)))
        fused += 1
    return fused


def fuse_elementwise_chains(module: ir.Module) -> int:
    """Fuse element-wise chains in the top-level blocks of the module's functions; the count fused."""
    total = 0
    for fn in module.body.operations:
        if fn.operation.name == "func.func" and fn.regions[0].blocks:
            total += _fuse_in_block(fn.regions[0].blocks[0])
    return total
