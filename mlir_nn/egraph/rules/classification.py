"""The softmax cross-entropy gradient in one pass over the logits.

Autodiff of ``cross_entropy`` (mean over rows of -sum(p * log_softmax(z), 1)) with a
constant upstream gradient c builds, for logits z (N, C) and targets p:

    log_softmax_grad(y, broadcast(mean_grad(c)) * p)      with y = log_softmax(z)
        = (c / N) * (p - exp(y) * sum(p, 1))
        == softmax_xent_grad(y, p, scale=-c)

i.e. (softmax(z) - onehot(labels)) / N for labels (c = -1 once ``neg(1.0)`` is folded, or
matched as ``neg(const)`` when the algebra rules do not run). The fused op reads the
forward's log-probabilities y (the loss needs them anyway) and p once: one row sum of p
and one element-wise pass. The chain it replaces is four kernels and three (N, C)
intermediates, so the cost model takes it.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rule, union

from mlir_nn.egraph.rules.common import build, dt, e, k, p, s, z
from mlir_nn.egraph.terms import Term, shape

ROW, BATCH_AXIS = Vec[i64](1), Vec[i64](0)


def _fused(name: str, seed: Term, scale) -> tuple[str, object]:
    upstream = Term.mean_grad(Term.reshape(seed, ROW), Vec[i64](s[0]), BATCH_AXIS)
    per_row = Term.broadcast_to(Term.reshape(upstream, Vec[i64](s[0], 1)), s)
    log_probs = Term.log_softmax(z, 1)
    pattern = Term.log_softmax_grad(log_probs, Term.mul(per_row, p), 1)
    return name, rule(eq(e).to(pattern), eq(s).to(shape(z)), eq(s.length()).to(i64(2))).then(
        union(e).with_(Term.softmax_xent_grad(log_probs, p, scale)))


RULES = [
    _fused("log_softmax_grad(y, mean_grad(c) * p) = softmax_xent_grad(y, p, -c)",
           Term.const(k, dt), -k),
    _fused("log_softmax_grad(y, mean_grad(-c) * p) = softmax_xent_grad(y, p, c)",
           Term.neg(Term.const(k, dt)), k),
]
RULESET = build("classification", RULES)
