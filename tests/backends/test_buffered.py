"""The interpreter tier's executable: the reference's results exactly, in reused buffers."""

import threading

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.backends.buffered import BufferedExecutable, _overlapping, kernel, plan
from mlir_nn.backends.reference import ReferenceExecutable
from mlir_nn.ir import Graph, make_node
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step


def traced(sizes: list[int], optimizer: type, batch: int, optimize: bool) -> tuple[Graph, list[np.ndarray]]:
    """An MLP training step's graph (traced, or after the e-graph) and its parameter arrays."""
    model = MLP(sizes[0], sizes[1:])
    opt = optimizer(model.parameters(), lr=1e-2)
    step = jit(train_step(model, opt, mse_loss), backend="numpy", optimize=optimize)
    rng = np.random.default_rng(1)
    step(rng.standard_normal((batch, sizes[0])).astype(np.float32),
         rng.standard_normal((batch, sizes[-1])).astype(np.float32))
    compiled = step._last
    graph = compiled.optimized_graph
    return graph, [a.copy() for a in compiled._param_arrays()]


def same_steps(graph: Graph, params: list[np.ndarray], batches: list[int], repeats: int = 2) -> None:
    """Both executables, each on its own copy of ``params``, give identical outputs and
    parameters for every call (batch sizes change between calls)."""
    reference, buffered = ReferenceExecutable(graph), BufferedExecutable(graph)
    theirs, ours = [p.copy() for p in params], [p.copy() for p in params]
    rng = np.random.default_rng(2)
    kept = []
    for batch in batches * repeats:
        inputs = [rng.standard_normal((batch, *node.shape[1:])).astype(node.dtype) for node in graph.inputs]
        expected, got = reference.run(inputs, theirs), buffered.run(inputs, ours)
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(g, e)
        for e, g in zip(theirs, ours):
            np.testing.assert_array_equal(g, e)
        kept.append((expected, got))
    for expected, got in kept:  # earlier calls' outputs are not buffers a later call wrote
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("optimize", [False, True], ids=["traced", "optimized"])
@pytest.mark.parametrize("optimizer", [SGD, Adam])
def test_mlp_steps_match_the_reference_exactly_at_awkward_batches(optimizer, optimize):
    graph, params = traced([13, 33, 7, 3], optimizer, 7, optimize)
    same_steps(graph, params, [7, 1, 13, 33, 257])


def test_buffers_are_reused_and_far_fewer_than_nodes():
    graph, params = traced([13, 33, 33, 33, 7], Adam, 5, optimize=False)
    step = plan(graph, 5)
    planned = sum(1 for i in step.instructions if i.buffer is not None and i.buffer >= 0)
    assert len(step.buffers) < planned  # some buffer holds more than one node's value
    same_steps(graph, params, [5, 9])


def views_graph() -> Graph:
    """Views of buffers as an output and an update: the reference's reshape returns views of
    a product and of a sum; (3, 3) products made after the view would take its buffer."""
    x = make_node("input", (), name="x", shape=("N", 3), dtype="float32")
    w = make_node("param", (), name="w", shape=(3, 3), dtype="float32")
    v = make_node("param", (), name="v", shape=(3, 3), dtype="float32")
    product = make_node("matmul", (x, w))  # (N, 3) in a buffer
    seen = make_node("reshape", (product,), shape=("N", 3))  # a view of it, an output
    square = make_node("add", (w, v))  # (3, 3) in a buffer
    moved = make_node("reshape", (square,), shape=(3, 3))  # a view of it, the new w
    later = make_node("sub", (make_node("sub", (moved, w)), v))
    return Graph((x,), (w, v), (seen, w, later), (("w", moved), ("v", later)))


def test_views_of_buffers_stay_valid_and_outputs_are_arrays_of_their_own():
    graph = views_graph()
    rng = np.random.default_rng(3)
    params = [rng.standard_normal((3, 3)).astype(np.float32) for _ in range(2)]
    same_steps(graph, params, [4, 1, 6], repeats=3)
    buffered = BufferedExecutable(graph)
    w, v = (p.copy() for p in params)
    before = w.copy()
    seen, old_w, later = buffered.run([rng.standard_normal((2, 3)).astype(np.float32)], [w, v])
    np.testing.assert_array_equal(old_w, before)  # the parameter's value before the step, a copy
    assert not np.may_share_memory(old_w, w) and not np.may_share_memory(later, v)


def test_ops_without_an_out_form_or_with_mixed_dtypes_run_their_reference():
    x = make_node("input", (), name="x", shape=(3,), dtype="float32")
    y = make_node("input", (), name="y", shape=(3,), dtype="float64")
    assert kernel(make_node("add", (x, x))) is not None
    assert kernel(make_node("log_softmax", (x,), axis=0)) is None
    assert kernel(make_node("add", (make_node("cast", (x,), dtype="float64"), y))) is not None
    assert kernel(make_node("pow", (x,), exponent=2.0)) is not None
    assert kernel(make_node("pow", (x,), exponent=3.0)) is None


def test_nan_masks_zero_as_the_reference_does():
    """relu_grad and matmul_relu_grad zero where the mask is NaN (NaN > 0 is false)."""
    z = make_node("input", (), name="z", shape=("N", 2), dtype="float32")
    g = make_node("input", (), name="g", shape=("N", 2), dtype="float32")
    mask = make_node("sqrt", (make_node("neg", (z,)),))  # NaN where z > 0
    w = make_node("param", (), name="w", shape=(2, 2), dtype="float32")
    outputs = (make_node("relu_grad", (mask, g)), make_node("matmul_relu_grad", (g, w, mask)))
    graph = Graph((z, g), (w,), outputs, ())
    inputs = [np.array([[1.0, -1.0], [-4.0, 0.0]], np.float32), np.array([[2.0, -3.0], [4.0, -1.0]], np.float32)]
    params = [np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)]
    with np.errstate(invalid="ignore"):
        expected, got = ReferenceExecutable(graph).run(inputs, params), BufferedExecutable(graph).run(inputs, params)
    for e, o in zip(expected, got):
        np.testing.assert_array_equal(o, e)
    np.testing.assert_array_equal(got[0], [[0.0, -3.0], [4.0, 0.0]])  # masks NaN and 0 zero


def test_copies_and_tanh_match_the_reference():
    """transpose (3-D perm) and broadcast_to copy into buffers; tanh writes with out=."""
    x = make_node("input", (), name="x", shape=("N", 2, 3), dtype="float64")
    b = make_node("param", (), name="b", shape=(3,), dtype="float64")
    moved = make_node("transpose", (make_node("tanh", (x,)),), perm=(2, 0, 1))  # (3, N, 2)
    spread = make_node("broadcast_to", (b,), shape=(4, 3))
    graph = Graph((x,), (b,), (moved, make_node("mul", (spread, spread))), (("b", make_node("neg", (b,))),))
    assert all(kernel(n) is not None for n in graph.nodes if n.op in ("transpose", "broadcast_to", "tanh"))
    same_steps(graph, [np.array([0.5, -1.0, 2.0])], [1, 7, 13])


def test_threads_calling_one_executable_at_once_get_their_own_buffers():
    """Large enough that NumPy lets go of the GIL inside ops: shared buffers gave wrong results."""
    graph, params = traced([300, 301, 3], Adam, 65, optimize=False)
    buffered, reference = BufferedExecutable(graph), ReferenceExecutable(graph)
    rng = np.random.default_rng(4)
    calls = [[rng.standard_normal((65, *n.shape[1:])).astype(np.float32) for n in graph.inputs] for _ in range(4)]
    expected = []
    for inputs in calls:
        copies = [p.copy() for p in params]
        expected.append((reference.run(inputs, copies), copies))
    got: list = [None] * len(calls)

    def work(k: int) -> None:
        for _ in range(10):  # many calls, so that the threads' calls overlap
            copies = [p.copy() for p in params]
            got[k] = (buffered.run(calls[k], copies), copies)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (outputs, updated), (want_outputs, want_updated) in zip(got, expected):
        for g, e in zip([*outputs, *updated], [*want_outputs, *want_updated]):
            np.testing.assert_array_equal(g, e)


def test_updates_write_into_their_parameters_and_hold_no_buffers():
    """An Adam step's new weights and moments are written in place: its buffers are a fraction
    of the parameters' bytes, and the results stay the reference's exactly."""
    graph, params = traced([13, 33, 33, 33, 7], Adam, 5, optimize=False)
    step = plan(graph, 5)
    written = {i.parameter for i in step.instructions if i.parameter is not None}
    slots = {p.attr("name"): n for n, p in enumerate(graph.params)}
    weights = {slots[name] for name, _ in graph.updates if len(graph.params[slots[name]].shape) == 2}
    assert weights <= written  # every weight and its two moments
    assert all(i.buffer is None for i in step.instructions if i.parameter is not None)
    assert step.first_write < len(step.instructions)
    same_steps(graph, params, [5, 1, 9])


def late_reader_graph() -> Graph:
    """``w``'s new value is made before a node that still reads the old ``w``; ``v``'s is last."""
    x = make_node("input", (), name="x", shape=(2, 2), dtype="float64")
    w = make_node("param", (), name="w", shape=(2, 2), dtype="float64")
    v = make_node("param", (), name="v", shape=(2, 2), dtype="float64")
    new_w = make_node("sub", (w, x))
    late = make_node("mul", (new_w, w))  # reads the old w after new_w exists
    new_v = make_node("div", (make_node("add", (v, late)), x))
    return Graph((x,), (w, v), (late,), (("w", new_w), ("v", new_v)))


def test_a_parameter_read_after_its_new_value_is_made_is_not_written_early():
    graph = late_reader_graph()
    step = plan(graph, None)
    assert [i.node.op for i in step.instructions if i.parameter is not None] == ["div"]  # v's, not w's
    rng = np.random.default_rng(5)
    same_steps(graph, [rng.standard_normal((2, 2)) for _ in range(2)], [2])


def test_a_raising_floating_point_error_leaves_every_parameter_unchanged():
    """Under np.errstate(divide="raise") the last update divides by zero: no parameter may have
    been written in place before it (w's update, made earlier, would have been)."""
    x = make_node("input", (), name="x", shape=(2,), dtype="float64")
    w = make_node("param", (), name="w", shape=(2,), dtype="float64")
    v = make_node("param", (), name="v", shape=(2,), dtype="float64")
    new_w = make_node("add", (w, x))
    new_v = make_node("div", (make_node("add", (v, new_w)), x))
    graph = Graph((x,), (w, v), (make_node("mul", (x, x)),), (("w", new_w), ("v", new_v)))
    assert len([i for i in plan(graph, None).instructions if i.parameter is not None]) == 2
    params = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]
    with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
        BufferedExecutable(graph).run([np.array([1.0, 0.0])], params)
    np.testing.assert_array_equal(params[0], [1.0, 2.0])
    np.testing.assert_array_equal(params[1], [3.0, 4.0])


def test_one_array_passed_as_two_parameters_is_updated_as_by_the_reference():
    graph = late_reader_graph()
    shared = np.array([[1.0, 2.0], [3.0, 4.0]])
    theirs, ours = shared.copy(), shared.copy()
    x = np.array([[0.5, 1.0], [2.0, 4.0]])
    expected = ReferenceExecutable(graph).run([x], [theirs, theirs])
    got = BufferedExecutable(graph).run([x], [ours, ours])
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("source,target", [((5, 3), (3,)), ((5, 3), (1, 3)), ((2, 5, 3), (5, 1)), ((4, 1), (4, 1)),
                                           ((1, 3), (3,))])
def test_sum_to_writes_what_its_reference_returns(source, target):
    x = make_node("input", (), name="x", shape=source, dtype="float32")
    summed = make_node("sum_to", (x,), shape=target)
    assert kernel(summed) is not None
    graph = Graph((x,), (), (make_node("mul", (summed, summed)), summed), ())
    data = np.random.default_rng(6).standard_normal(source).astype(np.float32)
    expected, got = ReferenceExecutable(graph).run([data], []), BufferedExecutable(graph).run([data], [])
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)


def test_overlapping_arguments_are_those_numpy_says_may_share_memory():
    """The sorted-bounds sweep that decides in-place writes agrees with ``np.may_share_memory``
    on every pair of random views of two buffers (nested, adjacent, strided, empty, transposed)."""
    rng = np.random.default_rng(7)
    bases = [np.zeros(64), np.zeros((8, 8))]
    for _ in range(300):
        arrays = []
        for _ in range(rng.integers(1, 7)):
            base = bases[rng.integers(2)].reshape(-1)
            start, stop = sorted(rng.integers(0, 65, size=2))
            view = base[start:stop:rng.integers(1, 4)][:: rng.choice([1, -1])]
            arrays.append(view if rng.random() < 0.8 else np.zeros(3))
        arrays.append(bases[1].T)
        expected = {n for n, a in enumerate(arrays)
                    if any(np.may_share_memory(a, b) for m, b in enumerate(arrays) if m != n)}
        assert _overlapping(arrays) == expected
