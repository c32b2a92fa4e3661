"""MSE forward and gradient written over one shared difference d = p - y:

* mse(p, y) == mean(d * d) over all axes;
* mse_grad(p, y, c) == d * mean_grad(2c, shape(p)), i.e. d * 2c / numel(p), for a constant
  upstream gradient c (1.0 when the loss is the step's output) and rank-2 p (a model's
  output); numel counts the batch at run time.

Both forms sit in the e-graph and the cost model picks: the separate mse and mse_grad
kernels stay unless computing d once is really cheaper (it is not while each of them is
a single pass over p and y).
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rule, set_, union

from mlir_nn.egraph.rules.common import build, dt, e, k, p, s, y
from mlir_nn.egraph.terms import Term, shape

D = Term.sub(p, y)
ALL2, ONES2 = Vec[i64](0, 1), Vec[i64](1, 1)
TWO_C = Term.const(2.0 * k, dt)
SCALE = Term.mean_grad(Term.reshape(TWO_C, ONES2), s, ALL2)


def _rank2_p(pattern: Term) -> tuple:
    return eq(e).to(pattern), eq(s).to(shape(p)), eq(s.length()).to(i64(2))


RULES = [
    ("mse(p, y) = mean((p - y)^2)", rule(*_rank2_p(Term.mse(p, y))).then(
        union(e).with_(Term.mean(Term.mul(D, D), ALL2, False)),
        set_(shape(D)).to(s), set_(shape(Term.mul(D, D))).to(s))),
    ("mse_grad(p, y, c) = (p - y) * mean_grad(2c)", rule(*_rank2_p(Term.mse_grad(p, y, Term.const(k, dt)))).then(
        union(e).with_(Term.mul(D, SCALE)),
        set_(shape(D)).to(s), set_(shape(TWO_C)).to(Vec[i64]()), set_(shape(Term.reshape(TWO_C, ONES2))).to(ONES2),
        set_(shape(SCALE)).to(s))),
]
RULESET = build("mse", RULES)
