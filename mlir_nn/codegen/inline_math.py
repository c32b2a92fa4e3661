"""float32 ``math.exp`` and ``math.erf`` as inline arithmetic the vectorizer can take (CPU backend).

Both became a libm call per element (``expf``, ``erff``): the call kept LLVM from
vectorizing the loop and, in a reduction, spilled the running total around every call
(in the GPT step the softmax's sum of exponentials ran at about 2.5 ns per element, and
``expf`` and ``erff`` alone took a sixth of the step). Here each becomes straight-line
arithmetic on the same scalar or vector type:

* exp (Cephes' ``expf``): n = floor(x log2(e) + 1/2), r = x - n ln 2 (ln 2 in two parts,
  the first exact in n * it), exp(x) = 2^n (1 + r + r^2 P(r)) with P of degree 5 on
  |r| <= ln(2)/2; 2^n is built from exponent bits in two halves, so it never overflows
  before the product does. x is clamped to [-104, 89] first: exp(-inf) and anything
  below -104 give 0 and anything above 88.73 gives +inf, as ``expf``.
* erf (the minimax polynomials of Arm's optimized-routines ``erff``): x + x P(x^2) for
  |x| < 0.921875, else sign(x) (1 - exp(-(a + a Q(a)))) with a = |x| < 7.8125 (the exp
  above), and sign(x) beyond.

A NaN stays NaN in both. Both are within 2 ulp of the correctly rounded result over the
float32 range (``tests/codegen/test_inline_math.py`` checks every exponent against NumPy
in float64). float64 ops are left to libm: float64 steps keep matching PyTorch to 1e-10.
"""

from __future__ import annotations

from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, math

from mlir_nn.codegen.walk import collect_ops

LOG2E = 1.44269504088896341
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = LN2_HI + LN2_LO; n * LN2_HI is exact
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
            5.0000001201e-1)  # highest degree first
EXP_LOW, EXP_HIGH = -104.0, 89.0  # exp(EXP_LOW) rounds to 0 and exp(EXP_HIGH) overflows in float32
ERF_SMALL, ERF_ONE = 0.921875, 7.8125  # the two intervals of erf; erf(x) rounds to 1 beyond ERF_ONE
ERF_POLY_SMALL = tuple(float.fromhex(h) for h in (
    "-0x1.3a1a82p-11", "0x1.473f48p-08", "-0x1.b68bd2p-06", "0x1.ce1a46p-04", "-0x1.8126e0p-02", "0x1.06eba6p-03"))
ERF_POLY_LARGE = tuple(float.fromhex(h) for h in (
    "0x1.222900p-16", "-0x1.91d2ccp-12", "0x1.fd1336p-9", "-0x1.8d6300p-6", "0x1.b55cb0p-4", "0x1.450aa0p-1",
    "0x1.079d0cp-3"))


class _Consts:
    """Constants of one float type (scalar or vector) and of the matching i32 type."""

    def __init__(self, ftype: ir.Type) -> None:
        self.ftype = ftype
        self.itype: ir.Type = ir.IntegerType.get_signless(32)
        if isinstance(ftype, ir.VectorType):
            self.itype = ir.VectorType.get(ir.VectorType(ftype).shape, self.itype)

    def f(self, value: float) -> ir.Value:
        if isinstance(self.ftype, ir.VectorType):
            attr = ir.FloatAttr.get(ir.F32Type.get(), value)
            return arith.constant(self.ftype, ir.DenseElementsAttr.get_splat(self.ftype, attr))
        return arith.constant(self.ftype, value)

    def i(self, value: int) -> ir.Value:
        if isinstance(self.itype, ir.VectorType):
            attr = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), value)
            return arith.constant(self.itype, ir.DenseElementsAttr.get_splat(self.itype, attr))
        return arith.constant(self.itype, value)


def _horner(c: _Consts, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
    p = c.f(coefficients[0])
    for k in coefficients[1:]:
        p = math.fma(p, x, c.f(k))
    return p


def _keep_nan(x: ir.Value, y: ir.Value) -> ir.Value:
    return arith.select(arith.cmpf(arith.CmpFPredicate.UNO, x, x), x, y)


def _exp(x: ir.Value) -> ir.Value:
    c = _Consts(x.type)
    low, high = c.f(EXP_LOW), c.f(EXP_HIGH)  # compares and selects: a NaN passes through both
    clamped = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, low), low, x)
    clamped = arith.select(arith.cmpf(arith.CmpFPredicate.OGT, clamped, high), high, clamped)
    n = math.floor(math.fma(clamped, c.f(LOG2E), c.f(0.5)))
    r = arith.subf(arith.subf(clamped, arith.mulf(n, c.f(LN2_HI))), arith.mulf(n, c.f(LN2_LO)))
    p = arith.addf(math.fma(arith.mulf(_horner(c, r, EXP_POLY), r), r, r), c.f(1.0))
    k = arith.fptosi(c.itype, n)
    half = arith.shrsi(k, c.i(1))

    def power(e: ir.Value) -> ir.Value:  # 2^e for -127 < e < 128, from its exponent bits
        return arith.bitcast(c.ftype, arith.shli(arith.addi(e, c.i(127)), c.i(23)))

    return _keep_nan(x, arith.mulf(arith.mulf(p, power(half)), power(arith.subi(k, half))))


def _erf(x: ir.Value) -> ir.Value:
    c = _Consts(x.type)
    a = math.absf(x)
    small = math.fma(x, _horner(c, arith.mulf(x, x), ERF_POLY_SMALL), x)
    tail = arith.subf(c.f(1.0), _exp(arith.negf(math.fma(a, _horner(c, a, ERF_POLY_LARGE), a))))
    tail = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, a, c.f(ERF_ONE)), tail, c.f(1.0))
    large = math.copysign(tail, x)
    return _keep_nan(x, arith.select(arith.cmpf(arith.CmpFPredicate.OLT, a, c.f(ERF_SMALL)), small, large))


EXPANSIONS: dict[str, Callable[[ir.Value], ir.Value]] = {"math.exp": _exp, "math.erf": _erf}


def _is_f32_expanded(op: ir.Operation) -> bool:
    if op.name not in EXPANSIONS:
        return False
    t = op.results[0].type
    element = ir.VectorType(t).element_type if isinstance(t, ir.VectorType) else t
    return isinstance(element, ir.F32Type)


def inline_f32_math(module: ir.Module) -> int:
    """Replace every f32 ``math.exp`` and ``math.erf`` of ``module`` by its expansion; how many."""
    found = collect_ops(module, _is_f32_expanded)
    with module.context, ir.Location.unknown():
        for op in found:
            with ir.InsertionPoint(op):
                value = EXPANSIONS[op.name](op.operands[0])
            op.results[0].replace_all_uses_with(value)
            op.erase()
    return len(found)
