"""Convolution epilogues: the bias and ReLU that follow a convolution ride along with it.

* conv2d(x, W) + reshape(b, (O, 1, 1)) == conv2d_bias(x, W, b, "none") when b has shape
  (O,) for an (N, O, P, Q) convolution (``F.conv2d``'s bias; either operand order);
* relu(conv2d_bias(..., "none")) == conv2d_bias(..., "relu").

The backward mask then reads the activation (fusion's relu_grad(z, g) == relu_grad(relu(z),
g)), so the pre-activation need not be kept.
"""

from __future__ import annotations

from egglog import Vec, eq, i64, rewrite, rule, union, var, vars_

from mlir_nn.egraph.rules.common import b, build, e, s, sa, w, x
from mlir_nn.egraph.terms import Term, shape

stride, padding, dilation = vars_("stride padding dilation", Vec[i64])
groups = var("groups", i64)
CONV = Term.conv2d(x, w, stride, padding, dilation, groups)


def _bias(add: Term) -> object:
    """``add`` of CONV and reshape(b, sa), where b is one value per output channel."""
    return rule(eq(e).to(add), eq(s).to(shape(e)), eq(shape(b)).to(Vec[i64](s[1])),
                eq(sa).to(Vec[i64](s[1], i64(1), i64(1))))


def _fused(activation: str) -> Term:
    return Term.conv2d_bias(x, w, b, stride, padding, dilation, groups, activation)


RULES = [
    ("conv2d(x, W) + b = conv2d_bias(x, W, b)",
     _bias(Term.add(CONV, Term.reshape(b, sa))).then(union(e).with_(_fused("none")))),
    ("b + conv2d(x, W) = conv2d_bias(x, W, b)",
     _bias(Term.add(Term.reshape(b, sa), CONV)).then(union(e).with_(_fused("none")))),
    ("relu(conv2d_bias(x, W, b)) = conv2d_bias(x, W, b, relu)", rewrite(Term.relu(_fused("none"))).to(_fused("relu"))),
]
RULESET = build("conv", RULES)
