"""The e-graph's language: one typed egglog constructor per IR op, and the shape analysis.

Static attributes are primitive constructor arguments (Bool, f64, String, Vec[i64]), so
rules can match on them. Dimensions are i64 with the batch symbol "N" written as -1.
The graph is loaded in bulk (``mlir_nn.egraph.rows``): ``node(i)`` names the traced graph's
i-th node, and attribute values are interned in lookup tables (``dims_attr(k)``, ...).
Input and parameter nodes become ``leaf(i)`` (``i`` indexes the graph's declarations),
and an op without a constructor here becomes ``opaque(key, args)``: rules never match
it, so it passes through the optimizer unchanged.

``shape(t)`` and ``dtype(t)`` are egglog functions (tables with no merge), set once per
e-class when the graph is loaded and by the rules for the few new terms they build. A rule
that equated terms of different shapes would set two values for one key, which egglog
rejects with an error: an unsound rewrite cannot go unnoticed.
"""

from __future__ import annotations

from egglog import Bool, BoolLike, Expr, String, StringLike, Vec, f64, f64Like, function, i64, i64Like

BATCH_DIM = -1  # "N" as an egglog i64


class Term(Expr):
    """A tensor-valued term; each classmethod is one IR op (same name and operand order)."""

    @classmethod
    def leaf(cls, index: i64Like) -> Term: ...
    @classmethod
    def const(cls, value: f64Like, dtype: StringLike) -> Term: ...
    @classmethod
    def opaque(cls, key: i64Like, args: Vec[Term]) -> Term: ...

    @classmethod
    def add(cls, a: Term, b: Term) -> Term: ...
    @classmethod
    def sub(cls, a: Term, b: Term) -> Term: ...
    @classmethod
    def mul(cls, a: Term, b: Term) -> Term: ...
    @classmethod
    def div(cls, a: Term, b: Term) -> Term: ...
    @classmethod
    def neg(cls, a: Term) -> Term: ...
    @classmethod
    def pow(cls, a: Term, exponent: f64Like) -> Term: ...
    @classmethod
    def relu(cls, a: Term) -> Term: ...
    @classmethod
    def tanh(cls, a: Term) -> Term: ...
    @classmethod
    def sigmoid(cls, a: Term) -> Term: ...
    @classmethod
    def exp(cls, a: Term) -> Term: ...
    @classmethod
    def log(cls, a: Term) -> Term: ...
    @classmethod
    def sqrt(cls, a: Term) -> Term: ...
    @classmethod
    def relu_grad(cls, x: Term, g: Term) -> Term: ...
    @classmethod
    def tanh_grad(cls, y: Term, g: Term) -> Term: ...
    @classmethod
    def sigmoid_grad(cls, y: Term, g: Term) -> Term: ...

    @classmethod
    def matmul(cls, a: Term, b: Term, transpose_a: BoolLike, transpose_b: BoolLike) -> Term: ...
    @classmethod
    def transpose(cls, a: Term, perm: Vec[i64]) -> Term: ...
    @classmethod
    def reshape(cls, a: Term, shape: Vec[i64]) -> Term: ...
    @classmethod
    def broadcast_to(cls, a: Term, shape: Vec[i64]) -> Term: ...
    @classmethod
    def sum_to(cls, a: Term, shape: Vec[i64]) -> Term: ...
    @classmethod
    def sum(cls, a: Term, axes: Vec[i64], keepdims: BoolLike) -> Term: ...
    @classmethod
    def mean(cls, a: Term, axes: Vec[i64], keepdims: BoolLike) -> Term: ...
    @classmethod
    def mean_grad(cls, g: Term, shape: Vec[i64], axes: Vec[i64]) -> Term: ...
    @classmethod
    def mse(cls, p: Term, y: Term) -> Term: ...
    @classmethod
    def mse_grad(cls, p: Term, y: Term, g: Term) -> Term: ...
    @classmethod
    def log_softmax(cls, a: Term, axis: i64Like) -> Term: ...
    @classmethod
    def conv2d(cls, x: Term, w: Term, stride: Vec[i64], padding: Vec[i64], dilation: Vec[i64],
               groups: i64Like, layout: StringLike) -> Term: ...
    @classmethod
    def max_pool2d(cls, x: Term, kernel: Vec[i64], stride: Vec[i64], padding: Vec[i64], dilation: Vec[i64],
                   ceil_mode: BoolLike, layout: StringLike) -> Term: ...
    @classmethod
    def conv2d_weight_grad(cls, x: Term, g: Term, kernel: Vec[i64], stride: Vec[i64], padding: Vec[i64],
                           dilation: Vec[i64], groups: i64Like, layout: StringLike) -> Term: ...
    @classmethod
    def conv2d_input_grad(cls, g: Term, w: Term, input_hw: Vec[i64], stride: Vec[i64], padding: Vec[i64],
                          dilation: Vec[i64], groups: i64Like, layout: StringLike) -> Term: ...
    @classmethod
    def max_pool2d_index(cls, x: Term, out: Term, kernel: Vec[i64], stride: Vec[i64], padding: Vec[i64],
                         dilation: Vec[i64], ceil_mode: BoolLike, layout: StringLike) -> Term: ...
    @classmethod
    def max_pool2d_grad(cls, g: Term, index: Term, input_hw: Vec[i64], kernel: Vec[i64], stride: Vec[i64],
                        padding: Vec[i64], dilation: Vec[i64], ceil_mode: BoolLike, layout: StringLike) -> Term: ...
    @classmethod
    def log_softmax_grad(cls, y: Term, g: Term, axis: i64Like) -> Term: ...

    # fused ops (made only by the rules)
    @classmethod
    def linear(cls, x: Term, w: Term, b: Term, transpose_a: BoolLike, transpose_b: BoolLike,
               activation: StringLike) -> Term: ...
    @classmethod
    def gemm(cls, a: Term, b: Term, c: Term, alpha: Term, beta: Term, transpose_a: BoolLike,
             transpose_b: BoolLike, subtract: BoolLike) -> Term: ...
    @classmethod
    def matmul_relu_grad(cls, a: Term, b: Term, z: Term, transpose_a: BoolLike, transpose_b: BoolLike) -> Term: ...
    @classmethod
    def softmax_xent_grad(cls, y: Term, p: Term, scale: f64Like) -> Term: ...
    @classmethod
    def conv2d_bias(cls, x: Term, w: Term, b: Term, stride: Vec[i64], padding: Vec[i64], dilation: Vec[i64],
                    groups: i64Like, activation: StringLike, layout: StringLike) -> Term: ...
    @classmethod
    def conv2d_weight_update(cls, x: Term, g: Term, c: Term, alpha: Term, beta: Term, kernel: Vec[i64],
                             stride: Vec[i64], padding: Vec[i64], dilation: Vec[i64], groups: i64Like,
                             subtract: BoolLike, layout: StringLike) -> Term: ...


@function
def shape(t: Term) -> Vec[i64]:
    """The e-class's shape (batch dim as -1); all terms of one e-class share it."""




@function
def dtype(t: Term) -> String:
    """The e-class's element type ("float32", ...), so rules can build constants of it."""


@function(egg_fn="mlirnn_node")
def node(index: i64Like) -> Term:
    """The traced graph's node ``index``; loading unions it with the node's term."""


@function(egg_fn="mlirnn_dims_attr")
def dims_attr(key: i64Like) -> Vec[i64]:
    """Interned dimension tuples (attributes and shapes), by key."""


@function(egg_fn="mlirnn_f64_attr")
def f64_attr(key: i64Like) -> f64:
    """Interned float attributes, by key."""


@function(egg_fn="mlirnn_bool_attr")
def bool_attr(key: i64Like) -> Bool:
    """The two flags, by key (0, 1)."""


@function(egg_fn="mlirnn_str_attr")
def str_attr(key: i64Like) -> String:
    """Interned string attributes and dtype names, by key."""
