"""Update folding: an optimizer step that consumes a matmul becomes one BLAS-style gemm,
alpha * op(A) @ op(B) + beta * C, so the weight gradient is never materialized when
nothing else reads it (the cost model decides). With G = op(A) @ op(B) and C of G's shape:

* C - lr * G                    == gemm(A, B, C, alpha=-lr, beta=1)      (plain SGD)
* beta * C - lr * G             == gemm(A, B, C, alpha=-lr, beta=beta)   (decay folded in)
* C - lr * (G + wd * C)         == gemm(A, B, C, alpha=-lr, beta=1 - lr*wd)
                                   (SGD with weight decay, as traced)
* mu * C + G                    == gemm(A, B, C, alpha=1, beta=mu)       (momentum buffer)
* C + G, C - G                  == gemm with alpha=+-1, beta=1
Both operand orders of + and * are written out.
"""

from __future__ import annotations

from egglog import eq, rule, union

from mlir_nn.egraph.rules.common import a, b, build, c, dt, e, k, k2, ta, tb
from mlir_nn.egraph.terms import Term, shape

G = Term.matmul(a, b, ta, tb)
LR, K2 = Term.const(k, dt), Term.const(k2, dt)


def _gemm(name: str, pattern: Term, alpha, beta) -> tuple[str, object]:
    """``pattern`` == gemm(a, b, c, alpha, beta) when c has the product's shape."""
    return name, rule(eq(e).to(pattern), eq(shape(c)).to(shape(G))).then(
        union(e).with_(Term.gemm(a, b, c, ta, tb, alpha, beta)))


RULES = [
    _gemm("C - lr*G = gemm(-lr, 1)", Term.sub(c, Term.mul(LR, G)), -k, 1.0),
    _gemm("C - G*lr = gemm(-lr, 1)", Term.sub(c, Term.mul(G, LR)), -k, 1.0),
    _gemm("beta*C - lr*G = gemm(-lr, beta)", Term.sub(Term.mul(K2, c), Term.mul(LR, G)), -k, k2),
    _gemm("C*beta - lr*G = gemm(-lr, beta)", Term.sub(Term.mul(c, K2), Term.mul(LR, G)), -k, k2),
    _gemm("C - lr*(G + wd*C) = gemm(-lr, 1 - lr*wd)",
          Term.sub(c, Term.mul(LR, Term.add(G, Term.mul(K2, c)))), -k, 1.0 - k * k2),
    _gemm("C - lr*(wd*C + G) = gemm(-lr, 1 - lr*wd)",
          Term.sub(c, Term.mul(LR, Term.add(Term.mul(K2, c), G))), -k, 1.0 - k * k2),
    _gemm("mu*C + G = gemm(1, mu)", Term.add(Term.mul(K2, c), G), 1.0, k2),
    _gemm("G + mu*C = gemm(1, mu)", Term.add(G, Term.mul(K2, c)), 1.0, k2),
    _gemm("C + G = gemm(1, 1)", Term.add(c, G), 1.0, 1.0),
    _gemm("G + C = gemm(1, 1)", Term.add(G, c), 1.0, 1.0),
    _gemm("C - G = gemm(-1, 1)", Term.sub(c, G), -1.0, 1.0),
]
RULESET = build("update", RULES)
