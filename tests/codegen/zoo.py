"""Graphs that hold many ops at once, so one compile checks a whole family of ops."""

from __future__ import annotations

import numpy as np

from mlir_nn.ir import Graph, Node, make_node


def _leaf(kind: str, name: str, shape: tuple, dtype: str) -> Node:
    return make_node(kind, [], name=name, shape=shape, dtype=dtype)


def const(value: float, dtype: str) -> Node:
    return make_node("const", [], value=value, dtype=dtype)


def elementwise_zoo(width: int, dtype: str) -> Graph:
    """Every elementwise, broadcast, layout and reduction op on (N, width) operands."""
    x = _leaf("input", "x", ("N", width), dtype)
    y = _leaf("input", "y", ("N", width), dtype)  # y > 0 (log, sqrt, div)
    b = _leaf("param", "b", (width,), dtype)
    s = _leaf("param", "s", (), dtype)
    n = make_node
    # width - 1 in every row (eq(x, x) is all ones): labels one_hot accepts, made from an input
    last_class = n("sub", [n("sum", [n("eq", [x, x])], axes=(1,), keepdims=False), const(1.0, dtype)])
    stacked = n("stack", [b, n("neg", [b]), b])
    outs = [
        n("add", [x, b]), n("sub", [b, x]), n("mul", [x, const(1.5, dtype)]), n("div", [x, y]),
        n("add", [x, s]), n("neg", [x]), n("pow", [x], exponent=2.0), n("pow", [x], exponent=3.0),
        n("pow", [y], exponent=0.5), n("relu", [x]), n("tanh", [x]), n("sigmoid", [x]), n("exp", [x]),
        n("log", [y]), n("sqrt", [y]), n("relu_grad", [x, y]), n("tanh_grad", [x, y]),
        n("sigmoid_grad", [x, y]), n("broadcast_to", [b], shape=("N", width)),
        n("sum_to", [x], shape=(width,)), n("sum_to", [x], shape=(1, width)),
        n("sum", [x], axes=(0,), keepdims=False), n("sum", [x], axes=(1,), keepdims=True),
        n("sum", [x], axes=(0, 1), keepdims=False), n("mean", [x], axes=(0,), keepdims=True),
        n("mean", [x], axes=(1,), keepdims=False), n("mean", [x], axes=(0, 1), keepdims=False),
        n("mean_grad", [n("reshape", [b], shape=(1, width))], shape=("N", width), axes=(0,)),
        n("mean_grad", [s], shape=("N", width), axes=(0, 1)),
        n("mse", [x, y]), n("mse_grad", [x, y, s]), n("mse_grad", [x, y, const(1.0, dtype)]),
        n("transpose", [x], perm=(1, 0)), n("reshape", [x], shape=(width, "N")),
        n("reshape", [n("sum", [x], axes=(0, 1), keepdims=False)], shape=(1, 1)),
        n("eq", [x, b]), n("max", [x], axes=(1,), keepdims=True), n("max", [x], axes=(0,), keepdims=False),
        n("max", [x], axes=(0, 1), keepdims=False), n("log_softmax", [x], axis=1), n("log_softmax", [x], axis=0),
        n("log_softmax_grad", [x, y], axis=1), n("softmax", [x], axis=1), n("softmax", [x], axis=0),
        n("softmax_grad", [x, y], axis=1), n("layer_norm", [x], eps=1e-5), n("layer_norm_grad", [x, y], eps=0.5),
        n("softmax_xent_grad", [n("log_softmax", [x], axis=1), y], scale=-0.5),
        n("one_hot", [last_class], classes=width), n("index", [stacked], index=1), stacked,
        # nn layers (issue 21a): s stands for every key and offset chunk (any value is taken mod 2**16)
        n("erf", [x]), n("numel", [x], axes=(0,)), n("dropout", [x] + [s] * 7, p=0.5, slot=3),
        # losses and masks (issue 21b)
        n("gt", [x, y]), n("ge", [x, b]), n("lt", [x, y]), n("sign", [x]), n("abs", [x]),
        n("maximum", [x, b]), n("minimum", [x, y]), n("softplus", [x]),
    ]
    return Graph((x, y), (b, s), tuple(outs), name="elementwise_zoo")


def matmul_zoo(k: int, m: int, dtype: str, rows: int | str = "N") -> Graph:
    """matmul in every transpose combination and the fused ops, x: (rows, k), w: (k, m); the
    rows are the (dynamic) batch unless given."""
    x = _leaf("input", "x", (rows, k), dtype)
    g = _leaf("input", "g", (rows, m), dtype)
    z = _leaf("input", "z", (rows, k), dtype)
    w = _leaf("param", "w", (k, m), dtype)
    bias = _leaf("param", "bias", (m,), dtype)
    c = _leaf("param", "c", (k, m), dtype)
    lr = _leaf("param", "lr", (), dtype)  # a run-time scalar, as an optimizer's learning rate
    n = make_node
    outs = [
        n("matmul", [x, w]),
        n("matmul", [x, g], transpose_a=True),
        n("matmul", [g, w], transpose_b=True),
        n("matmul", [w, x], transpose_a=True, transpose_b=True),
        n("matmul", [n("transpose", [x], perm=(1, 0)), g]),  # read through a transpose node
        n("linear", [x, w, bias], activation="relu"),
        n("linear", [x, w, bias], activation="none"),
        n("gemm", [x, g, c, const(-0.25, dtype), const(1.0, dtype)], transpose_a=True),
        n("gemm", [x, g, c, lr, n("sub", [const(1.0, dtype), lr])], transpose_a=True, subtract=True),
        n("matmul_relu_grad", [g, w, z], transpose_b=True),
    ]
    return Graph((x, g, z), (w, bias, c, lr), tuple(outs), name="matmul_zoo")


def arguments(graph: Graph, batch: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Random arguments; the input named y is positive and away from zero."""
    def draw(node: Node) -> np.ndarray:
        shape = tuple(batch if d == "N" else d for d in node.shape)
        value = rng.standard_normal(shape).astype(node.dtype)
        return np.abs(value) + 0.5 if node.attr("name") == "y" else value

    return [draw(i) for i in graph.inputs], [draw(p) for p in graph.params]


def sequence_zoo(dtype: str) -> Graph:
    """The sequence-model ops (issue 23): slices, gathers and their scatter-adds, where,
    comparisons and batched products, on an (N, 4, 6) input and a (5, 6) table."""
    x = _leaf("input", "x", ("N", 4, 6), dtype)
    table = _leaf("param", "table", (5, 6), dtype)
    rows = _leaf("param", "rows", (3, 2), dtype)  # integers in [0, 5)
    picks = _leaf("param", "picks", ("N", 4, 6), dtype)  # integers in [0, 4)
    n = make_node
    box = n("slice", [x], start=(0, 1, 0), step=(1, 2, 3), shape=("N", 2, 2))
    swapped = n("transpose", [x], perm=(0, 2, 1))
    outs = [
        box, n("slice_grad", [box], start=(0, 1, 0), step=(1, 2, 3), shape=("N", 4, 6)),
        n("take", [table, rows], axis=0), n("take_grad", [n("take", [table, rows], axis=0), rows], axis=0, size=5),
        n("take", [x, n("slice", [rows], start=(0, 0), step=(1, 1), shape=(1, 2))], axis=1),
        n("gather", [x, picks], axis=1), n("gather_grad", [x, picks], axis=1, size=4),
        n("where", [n("gt", [x, const(0.0, dtype)]), x, const(-1.0, dtype)]),
        n("lt", [x, picks]), n("le", [x, picks]), n("ge", [x, picks]), n("ne", [x, picks]),
        n("bmm", [x, swapped]),
    ]
    return Graph((x,), (table, rows, picks), tuple(outs), name="sequence_zoo")


def window_zoo(dtype: str) -> Graph:
    """The window ops (issue 22) and their gradients, traced from the engine's functions on an
    (N, 2, 7, 7) image: a convolution, max, average and adaptive pooling and a pad."""
    from mlir_nn.engine import Tensor, adaptive_avg_pool2d, avg_pool2d, conv2d, max_pool2d, pad
    from mlir_nn.jit import trace_step

    weight = Tensor(np.ones((3, 2, 3, 3)), dtype=dtype)
    second = Tensor(np.ones((3, 3, 3, 3)), dtype=dtype)  # its input gradient flows back to weight

    def windows(x):
        y = conv2d(conv2d(x, weight, padding=1), second, padding=1)
        outs = [y, max_pool2d(y, 2), avg_pool2d(y, 3, stride=2), adaptive_avg_pool2d(y, (2, 3)), pad(y, (1, 0, 2, 1))]
        sum(o.sum() for o in outs).backward()
        return (*outs, weight.grad)

    graph, _, _ = trace_step(windows, [np.zeros((2, 2, 7, 7), dtype)], ["x"])
    # the fused convolution ops, which only the optimizer's rules make
    x, w = graph.inputs[0], next(p for p in graph.params if p.shape == (3, 2, 3, 3))
    bias = make_node("param", (), name="bias", shape=(3,), dtype=dtype)
    conv = dict(stride=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 1), groups=1)
    fused = [make_node("conv2d_bias", [x, w, bias], activation=act, **conv) for act in ("none", "relu")]
    lr = make_node("param", (), name="lr", shape=(), dtype=dtype)
    fused.append(make_node("conv2d_weight_update", [x, fused[1], w, lr, const(0.9, dtype)], kernel=(3, 3),
                           subtract=True, **conv))  # an update folded into the weight gradient
    return Graph(graph.inputs, graph.params + (bias, lr), graph.outputs + tuple(fused), graph.updates,
                 name=graph.name)
