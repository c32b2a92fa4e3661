"""Algebraic identities. Each keeps the value and the shape of what it rewrites.

Rules that drop an operand (x + 0 -> x, x * 1 -> x) check that the result has the same
shape as the operand kept, since broadcasting could otherwise change it. ``x * 0`` becomes
zeros of the product's shape (this assumes finite x: inf * 0 is NaN). Constant folding
computes in float64, the precision the scalar attributes are held in. No commutativity or
associativity rule is used (both operand orders are written out instead), so saturation
cannot blow up.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, ne, rewrite, rule, set_, union

from mlir_nn.egraph.rules.common import P2, a, b, build, dt, e, k, k2, s, sa, x
from mlir_nn.egraph.terms import Term, dtype, shape

C0, C1 = Term.const(0.0, dt), Term.const(1.0, dt)


def _keep(name: str, pattern: Term) -> tuple[str, object]:
    """``pattern`` -> x when the result has x's shape."""
    return name, rule(eq(e).to(pattern), eq(shape(e)).to(shape(x))).then(union(e).with_(x))


RULES = [
    ("a constant is a scalar", rule(eq(e).to(Term.const(k, dt))).then(
        set_(shape(e)).to(Vec[i64]()), set_(dtype(e)).to(dt))),
    _keep("x + 0 = x", Term.add(x, C0)),
    _keep("0 + x = x", Term.add(C0, x)),
    _keep("x - 0 = x", Term.sub(x, C0)),
    _keep("x * 1 = x", Term.mul(x, C1)),
    _keep("1 * x = x", Term.mul(C1, x)),
    _keep("x / 1 = x", Term.div(x, C1)),
    ("x * 0 = zeros", rule(eq(e).to(Term.mul(x, C0)), eq(s).to(shape(e))).then(
        union(e).with_(Term.broadcast_to(C0, s)))),
    ("0 * x = zeros", rule(eq(e).to(Term.mul(C0, x)), eq(s).to(shape(e))).then(
        union(e).with_(Term.broadcast_to(C0, s)))),
    ("-(-x) = x", rewrite(Term.neg(Term.neg(x))).to(x)),
    ("(x^T)^T = x", rewrite(Term.transpose(Term.transpose(x, P2), P2)).to(x)),
    *[(f"(A@B)^T = B^T@A^T [{int(fa)}{int(fb)}]",
       rewrite(Term.transpose(Term.matmul(a, b, fa, fb), P2)).to(Term.matmul(b, a, not fb, not fa)))
      for fa in (False, True) for fb in (False, True)],
    ("relu(relu(x)) = relu(x)", rewrite(Term.relu(Term.relu(x))).to(Term.relu(x))),
    ("fold c1 + c2", rewrite(Term.add(Term.const(k, dt), Term.const(k2, dt))).to(Term.const(k + k2, dt))),
    ("fold c1 - c2", rewrite(Term.sub(Term.const(k, dt), Term.const(k2, dt))).to(Term.const(k - k2, dt))),
    ("fold c1 * c2", rewrite(Term.mul(Term.const(k, dt), Term.const(k2, dt))).to(Term.const(k * k2, dt))),
    ("fold c1 / c2", rewrite(Term.div(Term.const(k, dt), Term.const(k2, dt))).to(
        Term.const(k / k2, dt), ne(k2).to(0.0))),
    ("fold -c", rewrite(Term.neg(Term.const(k, dt))).to(Term.const(-k, dt))),
    ("c1 * (c2 * x) = (c1 * c2) * x",
     rewrite(Term.mul(Term.const(k, dt), Term.mul(Term.const(k2, dt), x))).to(Term.mul(Term.const(k * k2, dt), x))),
    ("broadcast_to(x, shape(x)) = x", rule(eq(e).to(Term.broadcast_to(x, s)), eq(shape(x)).to(s)).then(
        union(e).with_(x))),
    ("sum_to(x, shape(x)) = x", rule(eq(e).to(Term.sum_to(x, s)), eq(shape(x)).to(s)).then(union(e).with_(x))),
    ("broadcast(a) + broadcast(b) = broadcast(a + b)",
     rule(eq(e).to(Term.add(Term.broadcast_to(a, s), Term.broadcast_to(b, s))), eq(sa).to(shape(a)),
          eq(shape(b)).to(sa), eq(dt).to(dtype(a))).then(
         union(e).with_(Term.broadcast_to(Term.add(a, b), s)), set_(shape(Term.add(a, b))).to(sa),
         set_(dtype(Term.add(a, b))).to(dt))),
]
RULESET = build("algebra", RULES)
