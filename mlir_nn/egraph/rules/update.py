"""Update folding: an optimizer step that consumes a matmul becomes one BLAS-style gemm,
beta * C +- alpha * op(A) @ op(B), so the weight gradient is never materialized when
nothing else reads it (the cost model decides). alpha and beta are 0-d terms: constants,
or run-time scalars such as an optimizer's learning rate (a 0-d parameter of the step).
With G = op(A) @ op(B), C of G's shape and s, t scalars:

* C - s * G                 == gemm(A, B, C, s, 1, subtract)            (plain SGD)
* t * C - s * G             == gemm(A, B, C, s, t, subtract)            (decay folded in)
* C - s * (G + t * C)       == gemm(A, B, C, s, 1 - s * t, subtract)    (SGD with weight decay)
* t * C + G                 == gemm(A, B, C, 1, t)                      (momentum buffer)
* C + G, C - G              == gemm with alpha = beta = 1
Both operand orders of + and * are written out. New constants take C's dtype.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rule, set_, union

from mlir_nn.egraph.rules.common import a, b, build, c, dt, e, ta, tb, x, y
from mlir_nn.egraph.terms import Term, dtype, shape

G = Term.matmul(a, b, ta, tb)
ONE = Term.const(1.0, dt)
SCALAR = Vec[i64]()


def _gemm(name: str, pattern: Term, alpha: Term, beta: Term, subtract: bool,
          scalars: tuple[Term, ...] = (), new: tuple[Term, ...] = ()) -> tuple[str, object]:
    """``pattern`` == gemm(a, b, c, alpha, beta, subtract) when c has the product's shape and
    every term in ``scalars`` is 0-d; ``new`` are inner scalar terms the rule builds."""
    facts = [eq(e).to(pattern), eq(shape(c)).to(shape(G)), eq(dt).to(dtype(c))]
    facts += [eq(shape(v)).to(SCALAR) for v in scalars]
    actions = [union(e).with_(Term.gemm(a, b, c, alpha, beta, ta, tb, subtract))]
    for term in new:
        actions += [set_(shape(term)).to(SCALAR), set_(dtype(term)).to(dt)]
    return name, rule(*facts).then(*actions)


DECAYED = Term.sub(ONE, Term.mul(x, y))  # 1 - lr * weight_decay
RULES = [
    _gemm("C - s*G = gemm(s, 1, subtract)", Term.sub(c, Term.mul(x, G)), x, ONE, True, (x,)),
    _gemm("C - G*s = gemm(s, 1, subtract)", Term.sub(c, Term.mul(G, x)), x, ONE, True, (x,)),
    _gemm("t*C - s*G = gemm(s, t, subtract)", Term.sub(Term.mul(y, c), Term.mul(x, G)), x, y, True, (x, y)),
    _gemm("C*t - s*G = gemm(s, t, subtract)", Term.sub(Term.mul(c, y), Term.mul(x, G)), x, y, True, (x, y)),
    _gemm("C - s*(G + t*C) = gemm(s, 1 - s*t, subtract)",
          Term.sub(c, Term.mul(x, Term.add(G, Term.mul(y, c)))), x, DECAYED, True, (x, y),
          (Term.mul(x, y), DECAYED)),
    _gemm("C - s*(t*C + G) = gemm(s, 1 - s*t, subtract)",
          Term.sub(c, Term.mul(x, Term.add(Term.mul(y, c), G))), x, DECAYED, True, (x, y),
          (Term.mul(x, y), DECAYED)),
    _gemm("t*C + G = gemm(1, t)", Term.add(Term.mul(y, c), G), ONE, y, False, (y,)),
    _gemm("G + t*C = gemm(1, t)", Term.add(G, Term.mul(y, c)), ONE, y, False, (y,)),
    _gemm("C + G = gemm(1, 1)", Term.add(c, G), ONE, ONE, False),
    _gemm("G + C = gemm(1, 1)", Term.add(G, c), ONE, ONE, False),
    _gemm("C - G = gemm(1, 1, subtract)", Term.sub(c, G), ONE, ONE, True),
]
RULESET = build("update", RULES)
