"""Sums of placed slices (the gradient of a split, a concatenation) compiled as insertions into one
tensor, against the NumPy reference; sums whose boxes overlap stay adds."""

import numpy as np
import pytest

from mlir_nn.backends import get_backend
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import emit_linalg
from mlir_nn.ir import Graph, make_node


def _pieces_graph(dtype, width, boxes, rows=("N", 3)):
    """x of shape rows + (width,); each box (start, size) of the last axis squared and placed back
    at ``start + shift`` of a zero tensor, the placements summed left to right."""
    x = make_node("input", [], name="x", shape=rows + (width,), dtype=dtype)
    zero = (0,) * len(rows)
    total = None
    for start, size, shift in boxes:
        part = make_node("slice", [x], start=zero + (start,), step=(1,) * (len(rows) + 1), shape=rows + (size,))
        placed = make_node("slice_grad", [make_node("mul", [part, part])], start=zero + (start + shift,),
                           step=(1,) * (len(rows) + 1), shape=x.shape)
        total = placed if total is None else make_node("add", [total, placed])
    return Graph((x,), (), (total,), name="joined")


def _check(graph, batch):
    dtype = graph.inputs[0].dtype
    x = np.random.default_rng(batch).standard_normal(tuple(batch if d == "N" else d for d in graph.inputs[0].shape))
    want, _ = evaluate(graph, [x.astype(dtype)], [], batch)
    (got,) = get_backend("cpu").compile(graph).run([x.astype(dtype)], [])
    np.testing.assert_array_equal(got, want[0])  # each element is one square or zero: exact


COVERING = [(0, 4, 0), (4, 3, 0), (7, 6, 0)]  # the three parts of a split, placed back: all of x
PARTIAL = [(0, 4, 0), (7, 6, 0)]  # a gap of zeros in between
OVERLAPPING = [(0, 4, 0), (4, 3, 0), (7, 6, -5)]  # the last lands on the first two: added
OVERLAPPING_ONE = [(0, 4, 0), (4, 3, 0), (7, 6, -1)]  # one column shared with the second


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("boxes", [COVERING, PARTIAL, OVERLAPPING, OVERLAPPING_ONE, COVERING[::-1],
                                   COVERING + [(2, 5, 0)]],
                         ids=["covering", "partial", "overlapping", "overlapping-one", "reversed",
                              "covering-then-overlapping"])
@pytest.mark.parametrize("batch", [1, 7, 33])
def test_placed_slices_sum_as_the_reference(dtype, boxes, batch):
    _check(_pieces_graph(dtype, 13, boxes), batch)


def test_placements_over_a_static_middle_axis():
    x = make_node("input", [], name="x", shape=("N", 9, 2), dtype="float32")
    parts = [make_node("slice", [x], start=(0, a, 0), step=(1, 1, 1), shape=("N", n, 2)) for a, n in ((0, 5), (5, 4))]
    placed = [make_node("slice_grad", [make_node("neg", [p])], start=(0, a, 0), step=(1, 1, 1), shape=x.shape)
              for p, a in zip(parts, (0, 5))]
    _check(Graph((x,), (), (make_node("add", [placed[1], placed[0]]),), name="rows"), 13)


def _adds_and_fills(graph, strided_copies=True):
    text = str(emit_linalg(graph, strided_copies=strided_copies))
    return text.count("arith.addf"), text.count("linalg.fill"), text.count("tensor.insert_slice")


def test_disjoint_placements_become_insertions_and_overlapping_ones_stay_adds():
    adds, _, inserts = _adds_and_fills(_pieces_graph("float32", 13, COVERING))
    assert adds == 0 and inserts >= 3
    adds, _, _ = _adds_and_fills(_pieces_graph("float32", 13, OVERLAPPING))
    assert adds == 1  # the first two joined, the overlapping third added
    # without strided views (the CUDA path) every placement is a gather and every sum an add
    adds, _, inserts = _adds_and_fills(_pieces_graph("float32", 13, COVERING), strided_copies=False)
    assert adds == 2 and inserts == 0


def test_covering_pieces_need_no_zero_fill():
    """Once the pieces cover the tensor, they go into an empty one: the fills left are dead code."""
    from mlir_nn.backends.lowering import run_pipeline
    from mlir_nn.support.pipelines import Pipeline

    for boxes, fills in ((COVERING, 0), (PARTIAL, 1)):
        module = emit_linalg(_pieces_graph("float32", 13, boxes), strided_copies=True)
        run_pipeline(module, Pipeline("clean", ("canonicalize", "cse")))
        assert str(module).count("linalg.fill") == fills, boxes


def _merged_heads_graph(dtype, starts, heads=3, width=4, total=None):
    """Attention's gradient of a fused projection in small: per start, an input (2, heads, 5, width)
    with its head and time axes swapped, merged to (2, 5, heads * width) and placed at that start of
    the last axis of a (2, 5, total) zero tensor; the placements summed."""
    merged = heads * width
    total = total or merged * len(starts)
    xs, placed = [], None
    for i, start in enumerate(starts):
        x = make_node("input", [], name=f"x{i}", shape=(2, heads, 5, width), dtype=dtype)
        heads_last = make_node("transpose", [x], perm=(0, 2, 1, 3))
        piece = make_node("reshape", [heads_last], shape=(2, 5, merged))
        one = make_node("slice_grad", [piece], start=(0, 0, start), step=(1, 1, 1), shape=(2, 5, total))
        xs.append(x)
        placed = one if placed is None else make_node("add", [placed, one])
    return Graph(tuple(xs), (), (placed,), name="heads")


def _check_all(graph):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(x.shape).astype(x.dtype) for x in graph.inputs]
    want, _ = evaluate(graph, xs, [], None)
    (got,) = get_backend("cpu").compile(graph).run(xs, [])
    np.testing.assert_array_equal(got, want[0])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("starts", "total"), [
    ((0, 12, 24), None),  # q, k, v: all of the tensor
    ((24, 0, 12), None),  # placed out of order
    ((0, 24), 36),  # a gap of zeros: inserted into the first placement
    ((0, 14), 28),  # 14 is no whole number of heads: inserted merged
])
def test_merged_heads_join_as_the_reference(dtype, starts, total):
    _check_all(_merged_heads_graph(dtype, starts, total=total))


def _cleaned(graph):
    from mlir_nn.backends.lowering import run_pipeline
    from mlir_nn.support.pipelines import Pipeline

    module = emit_linalg(graph, strided_copies=True)
    run_pipeline(module, Pipeline("clean", ("canonicalize", "cse")))
    return str(module)


def test_merged_heads_are_inserted_before_their_merge():
    """Whole heads go into the joined tensor viewed as (2, 5, heads, width): the transposes can write
    there in place. A start inside a head keeps the merged insertions."""
    text = _cleaned(_merged_heads_graph("float32", (0, 12, 24)))
    inserts = [line for line in text.splitlines() if "tensor.insert_slice" in line]
    assert len(inserts) == 3 and all("tensor<2x5x3x4xf32> into tensor<2x5x9x4xf32>" in i for i in inserts)
    assert "linalg.fill" not in text
    text = _cleaned(_merged_heads_graph("float32", (0, 14), total=28))
    inserts = [line for line in text.splitlines() if "tensor.insert_slice" in line]
    assert len(inserts) == 2 and all("tensor<2x5x12xf32> into tensor<2x5x28xf32>" in i for i in inserts)


def test_equal_joins_keep_tensors_of_their_own():
    """Two joins of one shape (two layers' q, k, v gradients) start from empty tensors that CSE does
    not merge: inserted into one, bufferization copied in the first piece of each but one."""
    xs = [make_node("input", [], name=f"x{i}", shape=(2, 3, 5, 4), dtype="float32") for i in range(6)]
    outputs = []
    for layer in (xs[:3], xs[3:]):
        placed = None
        for x, start in zip(layer, (0, 12, 24)):
            piece = make_node("reshape", [make_node("transpose", [x], perm=(0, 2, 1, 3))], shape=(2, 5, 12))
            slot = make_node("slice_grad", [piece], start=(0, 0, start), step=(1, 1, 1), shape=(2, 5, 36))
            placed = slot if placed is None else make_node("add", [placed, slot])
        outputs.append(placed)
    graph = Graph(tuple(xs), (), tuple(outputs), name="two")
    assert _cleaned(graph).count("tensor.empty() {mlirnn.joined") == 2
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(x.shape).astype(np.float32) for x in xs]
    want, _ = evaluate(graph, arrays, [], None)
    got = get_backend("cpu").compile(graph).run(arrays, [])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
