"""The reference interpreter and the argument checks every backend shares."""

import signal

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.backends import get_backend
from mlir_nn.backends.reference import evaluate
from mlir_nn.ir import DTypeError, Graph, ShapeError, make_node
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import train_step


def linear_graph() -> Graph:
    x = make_node("input", (), name="x", shape=("N", 3), dtype="float64")
    w = make_node("param", (), name="w", shape=(3, 2), dtype="float64")
    y = make_node("matmul", (x, w))
    loss = make_node("mean", (y,), axes=(0, 1), keepdims=False)
    new_w = make_node("sub", (w, make_node("const", (), value=1.0, dtype="float64")))
    return Graph((x,), (w,), (loss,), (("w", new_w),))


def test_evaluate_binds_the_batch_dimension():
    g = linear_graph()
    w = np.arange(6.0).reshape(3, 2)
    for batch in (1, 4, 7):
        x = np.random.randn(batch, 3)
        (loss,), (new_w,) = evaluate(g, [x], [w], batch)
        assert loss == pytest.approx(np.mean(x @ w))
        np.testing.assert_array_equal(new_w, w - 1)


def test_run_updates_parameters_in_place():
    exe = get_backend("numpy").compile(linear_graph())
    w = np.zeros((3, 2))
    exe.run([np.ones((2, 3))], [w])
    np.testing.assert_array_equal(w, -np.ones((3, 2)))


@pytest.mark.parametrize("x,error,match", [
    (np.ones((2, 4)), ShapeError, r"input x has shape \(2, 4\), expected f64\[N, 3\]"),
    (np.ones((2, 3), np.float32), DTypeError, "dtype float32, expected float64"),
    (np.full((2, 3), np.nan), ValueError, "input x contains 6 NaN"),
    (np.ones((0, 3)), ShapeError, "batch is empty"),
    ([[1.0, 2.0, 3.0]], TypeError, "must be a numpy array"),
])
def test_bad_arguments_raise_and_leave_parameters_alone(x, error, match):
    exe = get_backend("numpy").compile(linear_graph())
    w = np.ones((3, 2))
    with pytest.raises(error, match=match):
        exe.run([x], [w])
    np.testing.assert_array_equal(w, np.ones((3, 2)))


def test_an_output_that_is_an_argument_is_its_value_before_the_step_and_a_copy():
    """The interpreter returned the parameter array itself: it then held the updated value,
    unlike every compiled backend, and writing into it wrote into the parameter."""
    w = make_node("param", (), name="w", shape=(3,), dtype="float32")
    x = make_node("input", (), name="x", shape=("N", 3), dtype="float32")
    new_w = make_node("add", (w, make_node("sum_to", (x,), shape=(3,))))
    graph = Graph((x,), (w,), (w, x, new_w), (("w", new_w),), name="echo")
    params, inputs = [np.arange(3, dtype=np.float32)], [np.ones((2, 3), np.float32)]
    old, echoed, new = get_backend("numpy").compile(graph).run(inputs, params)
    np.testing.assert_array_equal(old, [0, 1, 2])
    np.testing.assert_array_equal(new, [2, 3, 4])
    np.testing.assert_array_equal(params[0], [2, 3, 4])
    assert not any(np.shares_memory(o, a) for o in (old, echoed, new) for a in inputs + params)


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        get_backend("tpu")


class InterruptOnWrite(np.ndarray):
    """A parameter array that sends this process a SIGINT when it is written: a Ctrl-C landing
    in the middle of the interpreter's parameter writes."""

    def __setitem__(self, key, value):
        signal.raise_signal(signal.SIGINT)
        super().__setitem__(key, value)


def test_an_interrupt_during_the_parameter_writes_waits_for_all_of_them():
    np.random.seed(0)
    model = MLP(2, [3, 3, 1])
    step = jit(train_step(model, Adam(model.parameters(), lr=0.1)), backend="numpy")
    x, y = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
    step(x, y)  # the optimizer state exists now
    compiled = step.lower(x, y)
    want = [t.data.copy() for t in compiled.captured]
    compiled.executable.run([x, y], want)  # what one whole step writes
    params = [t.data.copy() for t in compiled.captured]
    middle = len(params) // 2
    params[middle] = params[middle].view(InterruptOnWrite)
    with pytest.raises(KeyboardInterrupt):
        compiled.executable.run([x, y], params)
    for got, expected in zip(params, want):
        np.testing.assert_array_equal(np.asarray(got), expected)
