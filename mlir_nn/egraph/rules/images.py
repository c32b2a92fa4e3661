"""Image layouts: convolutions, pools and their gradients computed in NHWC where the transposes
around them cancel.

Every window op may compute in NHWC (``layout="NHWC"``, ``mlir_nn.ir.layouts``) between
transposes (T: NHWC -> NCHW, T' its inverse): conv2d(x) == T(conv2d_nhwc(T'(x))), and so
conv2d_bias. Transposes then move forward through the ops that commute with them: max pooling
(max_pool2d(T(y)) == T(max_pool2d_nhwc(y))), element-wise ops (unary; binary with both operands
transposed alike, a scalar, or a per-channel (C, 1, 1) operand, which is (C,) along NHWC's last
axis), the backward ops (input gradient, weight gradient, a tiling pool's argmax and routing: each
in NHWC once one image operand is a transpose, the other transposed to meet it) and a bias
gradient's sum over a per-channel shape; a transpose meets its inverse: T'(T(y)) == y. A conv ->
relu -> pool -> conv chain and its backward then hold an all-NHWC program whose only transposes
are at its ends; the cost model (``conv_forms``: each form's moves between layouts, a transpose's
bytes, all measured) decides whether it is cheaper than NCHW. Only the e-classes that a transpose
reaches grow: apart from the convolutions' own rules, every rule here matches a transpose to NCHW.
"""

from __future__ import annotations

from collections.abc import Callable

from egglog import Bool, String, Vec, eq, i64, rewrite, rule, set_, union, var, vars_

from mlir_nn.egraph.rules.common import b, build, dt, e, g, s, sa, w, x, y, z
from mlir_nn.egraph.terms import Term, dtype, shape

P_NHWC = Vec[i64](0, 2, 3, 1)  # the perm of the transpose NCHW -> NHWC (T')
P_NCHW = Vec[i64](0, 3, 1, 2)  # NHWC -> NCHW (T)
SCALAR = Vec[i64]()
stride, padding, dilation, kernel, column, hw = vars_("stride padding dilation kernel column hw", Vec[i64])
groups = var("groups", i64)
activation = var("activation", String)
ceil_mode = var("ceil_mode", Bool)


def _nhwc(v: Vec[i64]) -> Vec[i64]:
    """An NCHW shape as the NHWC shape of the same image."""
    return Vec[i64](v[0], v[2], v[3], v[1])


def _typed(term: Term, term_shape: Vec[i64]) -> list:
    return [set_(shape(term)).to(term_shape), set_(dtype(term)).to(dt)]


def _in_nhwc(name: str, make: Callable[[Term, str], Term]) -> tuple[str, object]:
    """make(x, "NCHW") == T(make(T'(x), "NHWC")): the op computed in NHWC between transposes."""
    image = Term.transpose(x, P_NHWC)
    inner = make(image, "NHWC")
    facts = [eq(e).to(make(x, "NCHW")), eq(s).to(shape(x)), eq(sa).to(shape(e)), eq(dt).to(dtype(e))]
    return name, rule(*facts).then(union(e).with_(Term.transpose(inner, P_NCHW)), *_typed(image, _nhwc(s)),
                                   *_typed(inner, _nhwc(sa)))


def _moved(name: str, pattern: Term, inner: Term, *facts: object) -> tuple[str, object]:
    """pattern == T(inner), inner of the NHWC shape of pattern's result."""
    return name, rule(eq(e).to(pattern), eq(sa).to(shape(e)), eq(dt).to(dtype(e)), *facts).then(
        union(e).with_(Term.transpose(inner, P_NCHW)), *_typed(inner, _nhwc(sa)))


UNARY = {"relu": Term.relu, "neg": Term.neg, "tanh": Term.tanh, "sigmoid": Term.sigmoid, "exp": Term.exp,
         "log": Term.log, "sqrt": Term.sqrt}
BINARY = {"add": Term.add, "sub": Term.sub, "mul": Term.mul, "div": Term.div}
TY, TZ = Term.transpose(y, P_NCHW), Term.transpose(z, P_NCHW)
PER_CHANNEL = [eq(s).to(shape(y)), eq(shape(b)).to(Vec[i64](s[3])),
               eq(column).to(Vec[i64](s[3], i64(1), i64(1)))]  # b (C,) as (C, 1, 1) over T(y)

def _tiling(image: Vec[i64], pooled: Vec[i64]) -> list:
    """Facts: the pool's windows tile the NHWC ``image`` into ``pooled`` (the forms of the pooling
    gradients that read NHWC; other windows would run NCHW between transposes)."""
    return [eq(kernel).to(stride), eq(padding).to(Vec[i64](0, 0, 0, 0)), eq(dilation).to(Vec[i64](1, 1)),
            eq(image[1]).to(pooled[1] * kernel[0]), eq(image[2]).to(pooled[2] * kernel[1])]


def _index_in_nhwc() -> tuple[str, object]:
    """max_pool2d_index(x, T(z)) == T(max_pool2d_index_nhwc(T'(x), z)): the argmax positions (values
    h * W + w in either layout) of an NHWC pool."""
    image = Term.transpose(x, P_NHWC)
    inner = Term.max_pool2d_index(image, z, kernel, stride, padding, dilation, ceil_mode, "NHWC")
    pattern = Term.max_pool2d_index(x, TZ, kernel, stride, padding, dilation, ceil_mode, "NCHW")
    facts = [eq(e).to(pattern), eq(s).to(shape(x)), eq(sa).to(shape(e)), eq(dt).to(dtype(e)),
             *_tiling(_nhwc(s), _nhwc(sa))]
    return ("max_pool2d_index(x, T(z)) = T(max_pool2d_index_nhwc(T'(x), z))",
            rule(*facts).then(union(e).with_(Term.transpose(inner, P_NCHW)), *_typed(image, _nhwc(s)),
                              *_typed(inner, _nhwc(sa))))


def _pool_grad_in_nhwc() -> tuple[str, object]:
    """max_pool2d_grad(g, T(i)) == T(max_pool2d_grad_nhwc(T'(g), i))."""
    grad = Term.transpose(g, P_NHWC)
    inner = Term.max_pool2d_grad(grad, z, hw, kernel, stride, padding, dilation, ceil_mode, "NHWC")
    pattern = Term.max_pool2d_grad(g, TZ, hw, kernel, stride, padding, dilation, ceil_mode, "NCHW")
    facts = [eq(e).to(pattern), eq(s).to(shape(g)), eq(sa).to(shape(e)), eq(dt).to(dtype(e)),
             *_tiling(_nhwc(sa), _nhwc(s))]
    return ("max_pool2d_grad(g, T(i)) = T(max_pool2d_grad_nhwc(T'(g), i))",
            rule(*facts).then(union(e).with_(Term.transpose(inner, P_NCHW)), *_typed(grad, _nhwc(s)),
                              *_typed(inner, _nhwc(sa))))


def _weight_grad_in_nhwc() -> tuple[str, object]:
    """conv2d_weight_grad(x, T(g)) == conv2d_weight_grad_nhwc(T'(x), g): the weight's shape either way."""
    image = Term.transpose(x, P_NHWC)
    pattern = Term.conv2d_weight_grad(x, TZ, kernel, stride, padding, dilation, groups, "NCHW")
    return ("conv2d_weight_grad(x, T(g)) = conv2d_weight_grad_nhwc(T'(x), g)",
            rule(eq(e).to(pattern), eq(s).to(shape(x)), eq(sa).to(shape(e)), eq(dt).to(dtype(e))).then(
                union(e).with_(Term.conv2d_weight_grad(image, z, kernel, stride, padding, dilation, groups, "NHWC")),
                *_typed(image, _nhwc(s))))


def _per_channel_sum() -> tuple[str, object]:
    """sum_to(T(y), (C, 1, 1)) == reshape(sum_to(y, (C,)), (C, 1, 1)): a bias gradient summed from the
    NHWC gradient (along its last axis), not from a transpose of it."""
    channels = Vec[i64](s[3])
    summed = Term.sum_to(y, channels)
    return ("sum_to(T(y), (C, 1, 1)) = sum_to(y, (C,))",
            rule(eq(e).to(Term.sum_to(TY, column)), *PER_CHANNEL[:1], eq(column).to(Vec[i64](s[3], i64(1), i64(1))),
                 eq(dt).to(dtype(e))).then(union(e).with_(Term.reshape(summed, column)), *_typed(summed, channels)))


RULES = [
    _in_nhwc("conv2d(x) = T(conv2d_nhwc(T'(x)))",
             lambda image, lay: Term.conv2d(image, y, stride, padding, dilation, groups, lay)),
    _in_nhwc("conv2d_bias(x) = T(conv2d_bias_nhwc(T'(x)))",
             lambda image, lay: Term.conv2d_bias(image, y, z, stride, padding, dilation, groups, activation, lay)),
    ("T'(T(y)) = y", rewrite(Term.transpose(TY, P_NHWC)).to(y)),
    ("T(T'(y)) = y", rewrite(Term.transpose(Term.transpose(y, P_NHWC), P_NCHW)).to(y)),
    _moved("max_pool2d(T(y)) = T(max_pool2d_nhwc(y))",
           Term.max_pool2d(TY, kernel, stride, padding, dilation, ceil_mode, "NCHW"),
           Term.max_pool2d(y, kernel, stride, padding, dilation, ceil_mode, "NHWC")),
    _moved("conv2d_input_grad(T(y), W) = T(conv2d_input_grad_nhwc(y, W))",
           Term.conv2d_input_grad(TY, w, hw, stride, padding, dilation, groups, "NCHW"),
           Term.conv2d_input_grad(y, w, hw, stride, padding, dilation, groups, "NHWC")),
    _weight_grad_in_nhwc(),
    _index_in_nhwc(),
    _pool_grad_in_nhwc(),
    _per_channel_sum(),
    *[_moved(f"{n}(T(y)) = T({n}(y))", op(TY), op(y)) for n, op in UNARY.items()],
    *[_moved(f"{n}(T(y), T(z)) = T({n}(y, z))", op(TY, TZ), op(y, z), eq(shape(y)).to(shape(z)))
      for n, op in {**BINARY, "relu_grad": Term.relu_grad}.items()],
    *[_moved(f"{n}(T(y), c) = T({n}(y, c))", op(TY, b), op(y, b), eq(shape(b)).to(SCALAR)) for n, op in BINARY.items()],
    *[_moved(f"{n}(c, T(y)) = T({n}(c, y))", op(b, TY), op(b, y), eq(shape(b)).to(SCALAR)) for n, op in BINARY.items()],
    *[_moved(f"{n}(T(y), b[:, None, None]) = T({n}(y, b))", op(TY, Term.reshape(b, column)), op(y, b), *PER_CHANNEL)
      for n, op in BINARY.items()],
    *[_moved(f"{n}(b[:, None, None], T(y)) = T({n}(b, y))", op(Term.reshape(b, column), TY), op(b, y), *PER_CHANNEL)
      for n, op in BINARY.items()],
]
RULESET = build("images", RULES)
