"""Convolution epilogues: what follows a convolution or its weight gradient rides along with it.

* conv2d(x, W) + reshape(b, (O, 1, 1)) == conv2d_bias(x, W, b, "none") when b has shape
  (O,) for an (N, O, P, Q) convolution (``F.conv2d``'s bias; either operand order);
* relu(conv2d_bias(..., "none")) == conv2d_bias(..., "relu"); the backward mask then reads
  the activation (fusion's relu_grad(z, g) == relu_grad(relu(z), g)), so the pre-activation
  need not be kept;
* an optimizer's update of a weight gradient G = conv2d_weight_grad(x, g), C of the weight's
  shape and s, t 0-d, as the update rules do for products (``update``):
  C - s*G == conv2d_weight_update(x, g, C, s, 1, subtract), t*C - s*G with beta t, and
  t*C + G (a momentum buffer), C + G, C - G with alpha 1; both orders of + and *;
* BatchNorm2d in eval mode after a convolution (affine, running statistics: the
  normalization of ``F.batch_norm``, on the (N, C, H * W) view) folded into its weight and
  bias: conv2d_bias(x, W * scale, (b - mean) * scale + beta), or beta - mean * scale for a
  convolution without bias, where scale = gamma / sqrt(var + eps): computed per channel and
  per weight element, not per activation.
"""

from __future__ import annotations

from egglog import String, Vec, eq, i64, rewrite, rule, set_, union, var, vars_

from mlir_nn.egraph.rules.common import a, b, build, c, dt, e, g, k, p, s, sa, w, x, y
from mlir_nn.egraph.terms import Term, dtype, shape

stride, padding, dilation, kernel, per_channel, weight_shape = vars_(
    "stride padding dilation kernel per_channel weight_shape", Vec[i64])
groups = var("groups", i64)
layout = var("layout", String)
CONV = Term.conv2d(x, w, stride, padding, dilation, groups, "NCHW")  # the bias and BatchNorm read (O, 1, 1)
G = Term.conv2d_weight_grad(x, g, kernel, stride, padding, dilation, groups, layout)  # either layout
ONE = Term.const(1.0, dt)
SCALAR = Vec[i64]()


def _bias(add: Term) -> object:
    """``add`` of CONV and reshape(b, sa), where b is one value per output channel."""
    return rule(eq(e).to(add), eq(s).to(shape(e)), eq(shape(b)).to(Vec[i64](s[1])),
                eq(sa).to(Vec[i64](s[1], i64(1), i64(1))))


def _fused(activation: str, image_layout: object = "NCHW") -> Term:
    return Term.conv2d_bias(x, w, b, stride, padding, dilation, groups, activation, image_layout)


def _update(name: str, pattern: Term, alpha: Term, beta: Term, subtract: bool,
            scalars: tuple[Term, ...] = ()) -> tuple[str, object]:
    """``pattern`` == conv2d_weight_update(x, g, c, alpha, beta, subtract) when c has the weight's
    shape and every term in ``scalars`` is 0-d (the constant 1 gets its scalar shape here, as the
    algebra rules would give it, so that the extractor can price the fused term alone)."""
    facts = [eq(e).to(pattern), eq(shape(c)).to(shape(G)), eq(dt).to(dtype(c))]
    facts += [eq(shape(v)).to(SCALAR) for v in scalars]
    fused = Term.conv2d_weight_update(x, g, c, alpha, beta, kernel, stride, padding, dilation, groups, subtract,
                                      layout)
    actions = [union(e).with_(fused)]
    if alpha is ONE or beta is ONE:
        actions += [set_(shape(ONE)).to(SCALAR), set_(dtype(ONE)).to(dt)]
    return name, rule(*facts).then(*actions)


def _folded_batch_norm(biased: bool) -> tuple[str, object]:
    """reshape(((reshape(y, (N, C, HW)) - mean) / sqrt(var + eps)) * gamma + beta, (N, C, H, W))
    == conv2d_bias with the normalization folded in, y a convolution with a bias (``biased``) or
    without; mean, var, gamma, beta (C,), read as (C, 1)."""
    mean, var, gamma, beta = a, c, g, p
    eps = Term.const(k, dt)
    conv = _fused("none") if biased else CONV
    column = per_channel  # (C, 1)
    normalized = Term.div(Term.sub(Term.reshape(conv, sa), Term.reshape(mean, column)),
                          Term.sqrt(Term.add(Term.reshape(var, column), eps)))
    affine = Term.add(Term.mul(normalized, Term.reshape(gamma, column)), Term.reshape(beta, column))
    channels = Vec[i64](s[1])
    facts = [eq(e).to(Term.reshape(affine, s)), eq(s).to(shape(conv)), eq(sa.length()).to(i64(3)),
             eq(sa[0]).to(s[0]), eq(sa[1]).to(s[1]), eq(column).to(Vec[i64](s[1], i64(1))),
             eq(weight_shape).to(shape(w)), eq(dt).to(dtype(conv))]
    facts += [eq(shape(v)).to(channels) for v in (mean, var, gamma, beta)]
    std = Term.sqrt(Term.add(var, eps))
    scale = Term.div(gamma, std)
    scale4 = Term.reshape(scale, Vec[i64](s[1], i64(1), i64(1), i64(1)))
    weight = Term.mul(w, scale4)
    if biased:  # (b - mean) * scale + beta
        shifted = Term.mul(Term.sub(b, mean), scale)
        bias = Term.add(shifted, beta)
        inner = [Term.sub(b, mean), shifted]
    else:  # beta - mean * scale
        shifted = Term.mul(mean, scale)
        bias = Term.sub(beta, shifted)
        inner = [shifted]
    built = [(Term.add(var, eps), channels), (std, channels), (scale, channels), (bias, channels), (eps, SCALAR),
             (scale4, Vec[i64](s[1], i64(1), i64(1), i64(1))), (weight, weight_shape)]
    built += [(t, channels) for t in inner]
    actions = [union(e).with_(Term.conv2d_bias(x, weight, bias, stride, padding, dilation, groups, "none", "NCHW"))]
    for term, term_shape in built:
        actions += [set_(shape(term)).to(term_shape), set_(dtype(term)).to(dt)]
    name = ("BatchNorm(conv2d_bias(x, W, b)) = conv2d_bias(x, W * scale, (b - mean) * scale + beta)" if biased else
            "BatchNorm(conv2d(x, W)) = conv2d_bias(x, W * scale, beta - mean * scale)")
    return name, rule(*facts).then(*actions)


RULES = [
    ("conv2d(x, W) + b = conv2d_bias(x, W, b)",
     _bias(Term.add(CONV, Term.reshape(b, sa))).then(union(e).with_(_fused("none")))),
    ("b + conv2d(x, W) = conv2d_bias(x, W, b)",
     _bias(Term.add(Term.reshape(b, sa), CONV)).then(union(e).with_(_fused("none")))),
    ("relu(conv2d_bias(x, W, b)) = conv2d_bias(x, W, b, relu)",
     rewrite(Term.relu(_fused("none", layout))).to(_fused("relu", layout))),
    _folded_batch_norm(biased=True),
    _folded_batch_norm(biased=False),
    _update("C - s*dW = conv2d_weight_update(s, 1, subtract)", Term.sub(c, Term.mul(a, G)), a, ONE, True, (a,)),
    _update("C - dW*s = conv2d_weight_update(s, 1, subtract)", Term.sub(c, Term.mul(G, a)), a, ONE, True, (a,)),
    _update("t*C - s*dW = conv2d_weight_update(s, t, subtract)", Term.sub(Term.mul(y, c), Term.mul(a, G)), a, y, True,
            (a, y)),
    _update("C*t - s*dW = conv2d_weight_update(s, t, subtract)", Term.sub(Term.mul(c, y), Term.mul(a, G)), a, y, True,
            (a, y)),
    _update("t*C + dW = conv2d_weight_update(1, t)", Term.add(Term.mul(y, c), G), ONE, y, False, (y,)),
    _update("C*t + dW = conv2d_weight_update(1, t)", Term.add(Term.mul(c, y), G), ONE, y, False, (y,)),
    _update("dW + t*C = conv2d_weight_update(1, t)", Term.add(G, Term.mul(y, c)), ONE, y, False, (y,)),
    _update("dW + C*t = conv2d_weight_update(1, t)", Term.add(G, Term.mul(c, y)), ONE, y, False, (y,)),
    _update("C + dW = conv2d_weight_update(1, 1)", Term.add(c, G), ONE, ONE, False),
    _update("dW + C = conv2d_weight_update(1, 1)", Term.add(G, c), ONE, ONE, False),
    _update("C - dW = conv2d_weight_update(1, 1, subtract)", Term.sub(c, G), ONE, ONE, True),
]
RULESET = build("conv", RULES)
