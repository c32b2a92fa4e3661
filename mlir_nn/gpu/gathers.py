"""Product operands read through the copy that gathered them: implicit GEMM for convolutions.

The shared codegen writes a convolution as a gather into a buffer followed by a product
over a collapsed view of it: the im2col columns (``(N, P, Q, C, KH, KW)`` read from the
padded image at ``p * stride + kh * dilation``, viewed as ``(N * P * Q, C * KH * KW)``)
and the pixel rows of an output gradient (NCHW moved to ``(N * H * W, C)``). Such a
buffer is only written by one all-parallel ``linalg.generic`` that copies its single input
through an affine map, and only read by the product. ``find_gather`` recognizes it; the
register-tiled kernel (``mlir_nn.gpu.matmul``) then loads element ``(row, col)`` of the
view straight from the gather's input, ``image[read(delinearize(row, col))]``, and
``Gather.erase`` removes the copy and its buffer: the GEMM's K loop walks the window
indexing instead of a materialized im2col buffer.
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
    MemRefType,
    Operation,
    Value,
)

VIEWS = ("memref.expand_shape", "memref.collapse_shape", "memref.cast")


@dataclass
class Gather:
    """``view`` (a collapse of ``buffer``) equals ``image[read(i)]`` at every buffer index ``i``."""

    copy: Operation  # the linalg.generic filling the buffer
    view: Operation  # memref.collapse_shape of the buffer: the product's operand
    buffer: Operation  # memref.alloc
    image: Value
    read: AffineMap  # buffer index -> image index
    groups: list[list[int]]  # the view's reassociation

    def _extent(self, d: int) -> Value:
        t = MemRefType(self.buffer.results[0].type)
        if not t.is_dynamic_dim(d):
            return _index(t.shape[d])
        return self.buffer.operands[sum(t.is_dynamic_dim(i) for i in range(d))]

    def size(self, axis: int) -> Value:
        """Extent of the view's ``axis``, from the buffer's sizes (not through the view)."""
        total = None
        for d in self.groups[axis]:
            total = self._extent(d) if total is None else arith.muli(total, self._extent(d))
        return total

    def load(self, row: Value, col: Value) -> Value:
        """``view[row, col]`` read from the image (the caller keeps it inside the view)."""
        at: list[Value] = []
        for flat, group in zip((row, col), self.groups):
            parts = []
            for d in reversed(group[1:]):
                extent = self._extent(d)
                parts.append(arith.remui(flat, extent))
                flat = arith.divui(flat, extent)
            at += [flat, *reversed(parts)]
        return memref.load(self.image, [_evaluate(e, at) for e in self.read.results])

    def erase(self) -> None:
        """Remove the copy and its buffer (call once the view has no readers left)."""
        self.copy.erase()
        self.view.erase()
        for use in list(self.buffer.results[0].uses):
            use.owner.operation.erase()  # deallocs
        self.buffer.erase()


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


def _is_copy(op: Operation, buffer: Value) -> bool:
    """All-parallel, one input read through a plain affine map, ``buffer`` written at the identity."""
    if op.name != "linalg.generic" or len(op.operands) != 2 or op.operands[1] != buffer:
        return False
    if any("parallel" not in str(k) for k in ArrayAttr(op.attributes["iterator_types"])):
        return False
    read, write = (AffineMapAttr(m).value for m in ArrayAttr(op.attributes["indexing_maps"]))
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    return (isinstance(op.operands[0].type, MemRefType) and write == AffineMap.get_identity(write.n_dims)
            and read.n_symbols == 0 and all(_plain(e) for e in read.results)
            and len(body) == 1 and body[0].operands[0] == op.regions[0].blocks[0].arguments[0])


def _written(op: Operation) -> list[Value]:
    """Buffers a top-level op writes (linalg outs, copy targets)."""
    if op.name.startswith("linalg."):
        n_in, _ = list(op.attributes["operandSegmentSizes"])
        return [root(v) for v in list(op.operands)[n_in:]]
    if op.name == "memref.copy":
        return [root(op.operands[1])]
    return []


def find_gather(operand: Value, reader: Operation, block_ops: list[Operation]) -> Gather | None:
    """The gather behind ``operand`` of ``reader`` (see the module docstring), if it is one whose
    image nothing writes between the copy and ``reader``."""
    view = _owner(operand)
    if view is None or view.name != "memref.collapse_shape":
        return None
    if [u.owner.operation for u in operand.uses] != [reader]:
        return None
    buffer = view.operands[0]
    alloc = _owner(buffer)
    if alloc is None or alloc.name != "memref.alloc":
        return None
    users = [u.owner.operation for u in buffer.uses]
    copies = [u for u in users if u.name == "linalg.generic"]
    if len(copies) != 1 or any(u.name not in ("linalg.generic", "memref.dealloc") and u != view for u in users):
        return None
    copy = copies[0]
    t = MemRefType(buffer.type)
    groups = [[int(d) for d in g] for g in ArrayAttr(view.attributes["reassociation"])]
    if not _is_copy(copy, buffer) or len(groups) != 2 or any(t.is_dynamic_dim(d) for g in groups for d in g[1:]):
        return None
    if copy not in block_ops or reader not in block_ops:
        return None
    start, end = block_ops.index(copy), block_ops.index(reader)
    image = root(copy.operands[0])
    if start > end or any(image in _written(op) for op in block_ops[start + 1:end]):
        return None
    read = AffineMapAttr(ArrayAttr(copy.attributes["indexing_maps"])[0]).value
    return Gather(copy, view, alloc, copy.operands[0], read, groups)
