"""Lowering of ``dropout``: Philox-4x32-10 in 64-bit integer arithmetic inside the element loop.

Every intermediate stays a non-negative i64 below 2**49: each 32x32-bit product is taken
as two 32x16-bit ones, and shifts are divisions by powers of two. So the signed and
unsigned readings of each op agree, nothing overflows, and the code uses only ops that
every target (and the SIMT interpreter) has. The words equal ``mlir_nn.ir.philox``'s bit
for bit.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.builder import FunctionBuilder, Operand
from mlir_nn.ir import Node, philox
from mlir_nn.ir.ops import dropout_scale
from mlir_nn.ir.shapes import BATCH


class _Ints:
    """i64 arithmetic on non-negative values."""

    def __init__(self) -> None:
        self.type = ir.IntegerType.get_signless(64)

    def const(self, value: int) -> ir.Value:
        return arith.constant(self.type, value)

    def low(self, v: ir.Value, bits: int) -> ir.Value:
        return arith.andi(v, self.const((1 << bits) - 1))

    def high(self, v: ir.Value, bits: int) -> ir.Value:
        return arith.divui(v, self.const(1 << bits))

    def mulhilo(self, multiplier: int, c: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(high, low) 32-bit words of ``multiplier * c`` (both below 2**32)."""
        p1 = arith.muli(c, self.const(multiplier & 0xFFFF))
        p2 = arith.muli(c, self.const(multiplier >> 16))
        t = arith.addi(p2, self.high(p1, 16))
        low = arith.addi(arith.muli(self.low(t, 16), self.const(1 << 16)), self.low(p1, 16))
        return self.high(t, 16), low

    def from_chunks(self, chunks: list[ir.Value], extra: int = 0) -> ir.Value:
        """The integer held by 16-bit float chunks (least significant first, each mod 2**16), plus ``extra``."""
        total = self.const(extra)
        for i, chunk in enumerate(chunks):
            bits = self.low(arith.fptosi(self.type, chunk), 16)
            total = arith.addi(total, arith.muli(bits, self.const(1 << (16 * i))))
        return total


def philox_word0(ints: _Ints, counter: list[ir.Value], key: list[ir.Value]) -> ir.Value:
    """Word 0 of Philox-4x32-10 for four 32-bit counter words and two 32-bit key words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(philox.ROUNDS):
        if r:
            k0 = ints.low(arith.addi(k0, ints.const(philox.WEYL[0])), 32)
            k1 = ints.low(arith.addi(k1, ints.const(philox.WEYL[1])), 32)
        hi0, lo0 = ints.mulhilo(philox.MULTIPLIERS[0], c0)
        hi1, lo1 = ints.mulhilo(philox.MULTIPLIERS[1], c2)
        c0, c1, c2, c3 = arith.xori(arith.xori(hi1, c1), k0), lo1, arith.xori(arith.xori(hi0, c3), k1), lo0
    return c0


def _flat_index(b: FunctionBuilder, ints: _Ints, shape: tuple) -> ir.Value:
    """Row-major position of the current element of a linalg.generic over ``shape``."""
    flat, stride = ints.const(0), ints.const(1)
    for d in reversed(range(len(shape))):
        position = arith.index_cast(ints.type, linalg.IndexOp(d).result)
        flat = arith.addi(flat, arith.muli(position, stride))
        size = arith.index_cast(ints.type, b.batch) if shape[d] == BATCH else ints.const(int(shape[d]))
        stride = arith.muli(stride, size)
    return flat


def dropout(b: FunctionBuilder, node: Node, xs: list[Operand]) -> ir.Value:
    p, slot = float(node.attr("p")), int(node.attr("slot"))
    scale = float(dropout_scale(p, node.dtype))
    threshold = philox.keep_threshold(p)

    def element(x: ir.Value, *chunks: ir.Value) -> ir.Value:
        ints = _Ints()
        key_chunks, offset_chunks = list(chunks[:philox.KEY_CHUNKS]), list(chunks[philox.KEY_CHUNKS:])
        key = [ints.from_chunks(key_chunks[:2]), ints.from_chunks(key_chunks[2:])]
        offset = ints.from_chunks(offset_chunks, extra=slot)
        flat = _flat_index(b, ints, node.shape)
        counter = [ints.low(flat, 32), ints.high(flat, 32), ints.low(offset, 32), ints.high(offset, 32)]
        word = philox_word0(ints, counter, key)
        keep = arith.cmpi(arith.CmpIPredicate.sge, word, ints.const(threshold))
        return arith.select(keep, arith.mulf(x, b.scalar(scale)), b.scalar(0.0))

    return b.elementwise(node.shape, xs, [i.shape for i in node.inputs], element)
