"""The call path of a compiled CPU step: threads, parameters changed in place, the input check.

Results are compared bit for bit where the same compiled code runs on the same data.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.ir import DTypeError, ShapeError
from mlir_nn.nn import MLP
from tests.backends.test_cpu import TOL, make_step


def test_threads_calling_one_step_get_their_own_results():
    """Issue 9 item 4: argument descriptors were shared, so a call could run on (or return)
    another thread's arrays."""
    model = MLP(3, [16, 16, 2])

    def forward(x):
        return model(x)

    step = jit(forward)
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((batch, 3)).astype(np.float32) for batch in (5, 64, 1)]
    expected = [step(x) for x in cases]
    failures: list[str] = []
    deadline = time.monotonic() + 3.0

    def worker(k: int) -> None:
        x, want = cases[k], expected[k]
        calls = 0
        while time.monotonic() < deadline and calls < 20_000:
            got = step(x)
            calls += 1
            if got.shape != want.shape or not np.array_equal(got, want):
                failures.append(f"thread {k} call {calls}: wrong result")
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads)
    assert not failures, failures[:3]


def test_threads_training_one_step_apply_every_update_once():
    """Calls are serialized: 600 SGD steps on one batch from 3 threads equal 600 steps in a
    row, bit for bit (every call sees the same batch, so their order does not matter)."""
    sizes = [2, 8, 1]
    threaded, threaded_model, _ = make_step(sizes, "sgd", "cpu", 3, lr=0.01)
    serial, serial_model, _ = make_step(sizes, "sgd", "cpu", 3, lr=0.01)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((6, 2)).astype(np.float32), rng.standard_normal((6, 1)).astype(np.float32)
    threaded(x, y)
    serial(x, y)
    per_thread, n_threads = 200, 3
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=lambda: [threaded(x, y) for _ in range(per_thread)])
                   for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    for _ in range(per_thread * n_threads):
        serial(x, y)
    for p, q in zip(threaded_model.parameters(), serial_model.parameters()):
        np.testing.assert_array_equal(p.data, q.data)


@pytest.fixture
def trained():
    step, model, _ = make_step([3, 5, 2], "sgd", "cpu", 0, lr=0.1)
    x, y = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    step(x, y)  # one good call binds the parameters
    return step, model, x, y


def _set_strides(array: np.ndarray, strides: tuple[int, ...]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deprecated in NumPy 2.4, still possible
        array.strides = strides


@pytest.mark.parametrize("mutate, error, message", [
    (lambda w: setattr(w, "dtype", np.int32), DTypeError, "parameter p0 has dtype int32"),
    (lambda w: setattr(w, "shape", (5, 3)), ShapeError, r"parameter p0 has shape \(5, 3\)"),
    (lambda w: _set_strides(w, (4, 12)), ValueError, "parameter p0 is not C-contiguous"),
    (lambda w: w.setflags(write=False), ValueError, "parameter p0 is read-only"),
])
def test_a_parameter_array_changed_in_place_is_checked_again(trained, mutate, error, message):
    """Issue 9 item 9: after one good call the same array object was trusted as it was bound."""
    step, model, x, y = trained
    weight = model.parameters()[0].data
    raw = weight.view(np.uint8).copy()
    mutate(weight)
    with pytest.raises(error, match=message):
        step(x, y)
    np.testing.assert_array_equal(np.lib.stride_tricks.as_strided(weight, (3, 5), (20, 4)).view(np.uint8), raw)


def test_nan_in_any_input_is_reported_by_the_compiled_step_with_parameters_untouched(trained):
    step, model, x, y = trained
    before = [p.data.copy() for p in model.parameters()]
    bad_y = y.copy()
    bad_y[-1, -1] = np.nan
    with pytest.raises(ValueError, match="input y contains 1 NaN or infinite value"):
        step(x, bad_y)
    bad_x = x.copy()
    bad_x[0, 0] = bad_x[2, 1] = -np.inf
    with pytest.raises(ValueError, match="input x contains 2 NaN or infinite value"):
        step(bad_x, bad_y)  # the first bad input is named
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    step(x, y)
    assert not np.array_equal(model.parameters()[0].data, before[0])  # good calls still run


def test_outputs_are_fresh_arrays_not_views_of_the_workspace():
    model = MLP(3, [4, 2])

    def forward(x):
        return model(x)

    step = jit(forward)
    x = np.ones((5, 3), np.float32)
    first = step(x)
    kept = first.copy()
    second = step(2 * x)
    assert first.base is None and second.base is None and first is not second
    np.testing.assert_array_equal(first, kept)


def test_an_input_that_is_a_parameter_array_matches_the_reference():
    """x is the first layer's weight array itself (3x3: a batch of 3), then a view of its rows:
    the step reads it while it updates that array in place (the thin call leaves such calls to
    the checked path, which copies the input first)."""
    results = {}
    for backend in ("numpy", "cpu"):
        step, model, _ = make_step([3, 3, 1], "sgd", backend, 0, lr=0.1)
        weight = model.parameters()[0].data
        y = np.linspace(-1, 1, 3, dtype=np.float32).reshape(3, 1)
        losses = [float(step(weight, y)) for _ in range(3)]  # traced, then the call fast paths
        losses += [float(step(weight[1:], y[1:])) for _ in range(2)]
        results[backend] = losses, [p.data.copy() for p in model.parameters()]
    np.testing.assert_allclose(results["cpu"][0], results["numpy"][0], **TOL["float32"])
    for got, want in zip(results["cpu"][1], results["numpy"][1]):
        np.testing.assert_allclose(got, want, **TOL["float32"])


def test_big_endian_inputs_compute_like_native_ones():
    """They passed the checked path's dtype check (same dtype name) and were read byte-swapped."""
    x = np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32)
    y = np.ones((7, 1), np.float32)
    native, native_model, _ = make_step([3, 4, 1], "sgd", "cpu", 0, lr=0.1)
    swapped, swapped_model, _ = make_step([3, 4, 1], "sgd", "cpu", 0, lr=0.1)
    for _ in range(3):
        assert float(swapped(x.astype(">f4"), y.astype(">f4"))) == float(native(x, y))
    for a, b in zip(swapped_model.parameters(), native_model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_calls_a_step_its_parent_called():
    """The child renewed the call's lock and unbound it, but the step still took the
    workspace for the batch as bound: every call in the child raised 'no workspace bound'."""
    step, model, _ = make_step([3, 5, 2], "sgd", "cpu", 0, lr=0.1)
    x, y = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    step(x, y)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports, never raises: pytest must not run on in it
        try:
            got = step(x, y)
            message = f"ok {float(np.asarray(got).ravel()[0])!r}"
        except BaseException as error:
            message = f"{type(error).__name__}: {error}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    reported = os.read(read, 1000).decode()
    os.waitpid(pid, 0)
    assert reported == f"ok {float(np.asarray(step(x, y)).ravel()[0])!r}"
