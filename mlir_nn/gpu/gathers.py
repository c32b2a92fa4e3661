"""Product operands read through the ops that gathered them: implicit GEMM for convolutions.

The shared codegen writes a convolution as gathers into buffers followed by a product over a
collapsed view of the last one: the input padded (a generic that selects zero outside the
image), the im2col columns (``(N, P, Q, C, KH, KW)`` read from the padded image at
``p * stride + kh * dilation``, viewed as ``(N * P * Q, C * KH * KW)``), an output
gradient spread by the stride or moved to pixel rows, a weight flipped. Each such buffer
is written only by one all-parallel ``linalg.generic`` (a ``Source``): inputs read through
plain affine maps, a body of scalar arithmetic, ``linalg.index`` and loads. ``find_gather``
recognizes the product's operand as one, together with the sources its producer reads in
turn; the register-tiled kernel (``mlir_nn.gpu.matmul``) then computes element
``(row, col)`` of the view in place, evaluating the producers' bodies at the delinearized
index instead of loading a materialized buffer, and ``Gather.erase`` removes the producers
and buffers nothing else reads: the GEMM's K loop walks the window indexing.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir.dialects import arith, memref
from mlir.ir import (
    AffineAddExpr,
    AffineConstantExpr,
    AffineDimExpr,
    AffineExpr,
    AffineMap,
    AffineMapAttr,
    AffineMulExpr,
    ArrayAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    Operation,
    Value,
)

VIEWS = ("memref.expand_shape", "memref.collapse_shape", "memref.cast")


BODY_OPS = ("arith.", "math.", "linalg.index", "memref.load", "linalg.yield")


@dataclass
class Source:
    """A buffer (``alloc``) written only by ``producer``, element by element."""

    alloc: Operation
    producer: Operation

    @property
    def buffer(self) -> Value:
        return self.alloc.results[0]

    def extent(self, d: int) -> Value:
        t = MemRefType(self.buffer.type)
        if not t.is_dynamic_dim(d):
            return _index(t.shape[d])
        return self.alloc.operands[sum(t.is_dynamic_dim(i) for i in range(d))]


@dataclass
class Gather:
    """``view`` (a collapse of ``source``'s buffer) computed element by element from ``sources``
    (``source`` first, then what its producer reads, recursively)."""

    view: Operation
    sources: list[Source]
    groups: list[list[int]]  # the view's reassociation

    def size(self, axis: int) -> Value:
        """Extent of the view's ``axis``, from the buffer's sizes (not through the view)."""
        total = None
        for d in self.groups[axis]:
            e = self.sources[0].extent(d)
            total = e if total is None else arith.muli(total, e)
        return total

    def load(self, row: Value, col: Value) -> Value:
        """``view[row, col]``, computed (the caller keeps it inside the view)."""
        at: list[Value] = []
        for flat, group in zip((row, col), self.groups):
            parts = []
            for d in reversed(group[1:]):
                extent = self.sources[0].extent(d)
                parts.append(arith.remui(flat, extent))
                flat = arith.divui(flat, extent)
            at += [flat, *reversed(parts)]
        return self._element(self.sources[0], at)

    def _read(self, v: Value, at: list[Value]) -> Value:
        for source in self.sources:
            if source.buffer == v:
                return self._element(source, at)
        return memref.load(v, at)

    def _element(self, source: Source, at: list[Value]) -> Value:
        """The producer's body at index ``at``: inputs read (or computed) through their maps."""
        op = source.producer
        block = op.regions[0].blocks[0]
        args = list(block.arguments)
        mapping: dict[Value, Value] = {}
        for arg, v, attr in zip(args[:-1], list(op.operands)[:-1], ArrayAttr(op.attributes["indexing_maps"])):
            index = [_evaluate(e, at) for e in AffineMapAttr(attr).value.results]
            mapping[arg] = self._read(v, index) if isinstance(v.type, MemRefType) else v
        body = [o.operation for o in block.operations]
        for child in body[:-1]:
            if child.name == "linalg.index":
                mapping[child.results[0]] = at[IntegerAttr(child.attributes["dim"]).value]
                continue
            new = child.clone()
            for i, v in enumerate(new.operands):
                if v in mapping:
                    new.operands[i] = mapping[v]
            for old, fresh in zip(child.results, new.results):
                mapping[old] = fresh
        result = body[-1].operands[0]
        return mapping.get(result, result)

    def erase(self) -> None:
        """Remove the view and every source nothing else reads any more (call once the product's
        kernel replaced the product)."""
        self.view.erase()
        for source in self.sources:
            users = [u.owner.operation for u in source.buffer.uses]
            if any(u != source.producer and u.name != "memref.dealloc" for u in users):
                continue
            source.producer.erase()
            for use in list(source.buffer.uses):
                use.owner.operation.erase()  # deallocs
            source.alloc.erase()


def _index(v: int) -> Value:
    return arith.constant(IndexType.get(), v)


def _evaluate(expr: AffineExpr, dims: list[Value]) -> Value:
    expr = expr.maybe_downcast()
    if isinstance(expr, AffineDimExpr):
        return dims[expr.position]
    if isinstance(expr, AffineConstantExpr):
        return _index(expr.value)
    op = arith.addi if isinstance(expr, AffineAddExpr) else arith.muli
    return op(_evaluate(expr.lhs, dims), _evaluate(expr.rhs, dims))


def _plain(expr: AffineExpr) -> bool:
    """Dims, non-negative constants, sums and products only (what ``_evaluate`` emits)."""
    expr = expr.maybe_downcast()
    if isinstance(expr, AffineDimExpr):
        return True
    if isinstance(expr, AffineConstantExpr):
        return expr.value >= 0
    if isinstance(expr, AffineAddExpr | AffineMulExpr):
        return _plain(expr.lhs) and _plain(expr.rhs)
    return False


def _owner(v: Value) -> Operation | None:
    """The op defining ``v`` (None for a block argument)."""
    owner = v.owner
    return owner.operation if hasattr(owner, "operation") else None


def root(v: Value) -> Value:
    """The buffer under a chain of views."""
    while (owner := _owner(v)) is not None and owner.name in VIEWS:
        v = owner.operands[0]
    return v


def _source(buffer: Value, block_ops: list[Operation]) -> Source | None:
    """``buffer`` as a ``Source``: an allocation every other user of which only reads it or frees it,
    written by one top-level all-parallel generic (inputs through plain maps, identity output, a
    body of ``BODY_OPS`` that does not read the output)."""
    alloc = _owner(buffer)
    if alloc is None or alloc.name != "memref.alloc":
        return None
    writers = [op for op in block_ops if buffer in written(op)]
    if len(writers) != 1:
        return None
    op = writers[0]
    if any(u.owner.operation.name not in ("memref.dealloc", "memref.collapse_shape", "memref.expand_shape")
           and not u.owner.operation.name.startswith("linalg.") for u in buffer.uses):
        return None
    if op.name != "linalg.generic" or any("parallel" not in str(k) for k in ArrayAttr(op.attributes["iterator_types"])):
        return None
    n_in, n_out = list(op.attributes["operandSegmentSizes"])
    maps = [AffineMapAttr(m).value for m in ArrayAttr(op.attributes["indexing_maps"])]
    if n_out != 1 or op.operands[n_in] != buffer or maps[-1] != AffineMap.get_identity(maps[-1].n_dims):
        return None
    if any(m.n_symbols or not all(_plain(e) for e in m.results) for m in maps[:-1]):
        return None
    block = op.regions[0].blocks[0]
    body = [o.operation for o in block.operations]
    if list(block.arguments[-1].uses) or any(o.regions or not o.name.startswith(BODY_OPS) for o in body):
        return None
    return Source(alloc, op)


def _reads(source: Source) -> list[Value]:
    """Buffers the producer reads: its memref inputs and what its body loads."""
    op = source.producer
    n_in, _ = list(op.attributes["operandSegmentSizes"])
    loads = [o.operation.operands[0] for o in op.regions[0].blocks[0].operations if o.operation.name == "memref.load"]
    return [root(v) for v in list(op.operands)[:n_in] + loads if isinstance(v.type, MemRefType)]


def written(op: Operation) -> list[Value]:
    """Buffers a top-level op writes (linalg outs, copy targets)."""
    if op.name.startswith("linalg."):
        n_in, _ = list(op.attributes["operandSegmentSizes"])
        return [root(v) for v in list(op.operands)[n_in:]]
    if op.name == "memref.copy":
        return [root(op.operands[1])]
    return []


def find_gather(operand: Value, reader: Operation, block_ops: list[Operation]) -> Gather | None:
    """The gather behind ``operand`` of ``reader`` (see the module docstring), if nothing writes what
    its producers read between each producer and ``reader``."""
    view = _owner(operand)
    if view is None or view.name != "memref.collapse_shape" or reader not in block_ops:
        return None
    if [u.owner.operation for u in operand.uses] != [reader]:
        return None
    t = MemRefType(view.operands[0].type)
    groups = [[int(d) for d in g] for g in ArrayAttr(view.attributes["reassociation"])]
    if len(groups) != 2 or any(t.is_dynamic_dim(d) for g in groups for d in g[1:]):
        return None
    first = _source(view.operands[0], block_ops)
    if first is None:
        return None
    sources, end = [first], block_ops.index(reader)
    for source in sources:  # grows: the sources each producer reads, when they are sources themselves
        start = block_ops.index(source.producer)
        if start > end:
            return None
        for read in _reads(source):  # a source read by a body's load stays (the cloned load reads it)
            inner = _source(read, block_ops) if _owner(read) is not None and read == root(read) else None
            if inner is not None and all(s.buffer != read for s in sources):
                sources.append(inner)
            elif inner is None and any(read in written(op) for op in block_ops[start + 1:end]):
                return None
    return Gather(view, sources, groups)
