"""Fusion: epilogues that ride along with the matmul that feeds them.

* op(x) @ op(W) + b == linear(x, W, b, activation="none") when b has shape (n,) for an
  (m, n) product (a bias broadcast over rows; any other b is an ordinary add);
* relu(linear(..., "none")) == linear(..., "relu");
* relu_grad(z, g) == relu_grad(relu(z), g), since relu(z) > 0 exactly where z > 0: the
  backward mask can be read from the forward activation, so the pre-activation need not
  be kept (rewritten only when relu(z) already exists);
* relu_grad(z, op(a) @ op(b)) == matmul_relu_grad(a, b, z): the mask as the epilogue of the
  backward product.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rewrite, rule, union

from mlir_nn.egraph.rules.common import a, b, build, e, g, s, ta, tb, w, x, z
from mlir_nn.egraph.terms import Term, shape


def _bias(add: Term) -> object:
    return rule(eq(e).to(add), eq(s).to(shape(e)), eq(shape(b)).to(Vec[i64](s[1])))


RULES = [
    ("op(x)@op(W) + b = linear(x, W, b)", _bias(Term.add(Term.matmul(x, w, ta, tb), b)).then(
        union(e).with_(Term.linear(x, w, b, ta, tb, "none")))),
    ("b + op(x)@op(W) = linear(x, W, b)", _bias(Term.add(b, Term.matmul(x, w, ta, tb))).then(
        union(e).with_(Term.linear(x, w, b, ta, tb, "none")))),
    ("relu(linear(x, W, b)) = linear(x, W, b, relu)",
     rewrite(Term.relu(Term.linear(x, w, b, ta, tb, "none"))).to(Term.linear(x, w, b, ta, tb, "relu"))),
    ("relu_grad(z, g) = relu_grad(relu(z), g)",
     rule(eq(e).to(Term.relu_grad(z, g)), eq(a).to(Term.relu(z))).then(union(e).with_(Term.relu_grad(a, g)))),
    ("relu_grad(z, op(a)@op(b)) = matmul_relu_grad(a, b, z)",
     rewrite(Term.relu_grad(z, Term.matmul(a, b, ta, tb))).to(Term.matmul_relu_grad(a, b, z, ta, tb))),
]
RULESET = build("fusion", RULES)
