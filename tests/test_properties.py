"""Property-based checks of whole training steps: random MLPs, batches, dtypes, optimizers.

Each example compiles a new step, so examples are few and drawn deterministically."""

import gc
import signal
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step

TOLERANCE = {"float32": 2e-4, "float64": 1e-10}

optimizers = st.one_of(
    st.builds(lambda lr, mu, wd: (SGD, {"lr": lr, "momentum": mu, "weight_decay": wd}),
              st.sampled_from([0.0, 0.01, 0.1]), st.sampled_from([0.0, 0.9]), st.sampled_from([0.0, 0.05])),
    st.builds(lambda lr, wd: (Adam, {"lr": lr, "weight_decay": wd}),
              st.sampled_from([1e-3, 0.05]), st.sampled_from([0.0, 0.01])),
)


@settings(max_examples=6, derandomize=True, deadline=None)
@given(widths=st.lists(st.integers(1, 9), min_size=2, max_size=4), batches=st.lists(st.integers(1, 13), min_size=3,
       max_size=3), dtype=st.sampled_from(["float32", "float64"]), optimizer=optimizers, seed=st.integers(0, 99))
def test_compiled_steps_match_the_reference_after_several_steps(widths, batches, dtype, optimizer, seed):
    cls, args = optimizer
    np.random.seed(seed)
    models = [MLP(widths[0], widths[1:], dtype=dtype) for _ in range(2)]
    for a, b in zip(*(m.parameters() for m in models)):
        b.data[...] = a.data
    steps = [jit(train_step(m, cls(m.parameters(), **args)), backend=backend)
             for m, backend in zip(models, ("numpy", "cpu"))]
    rng = np.random.default_rng(seed)
    for batch in batches:
        x = rng.standard_normal((batch, widths[0])).astype(dtype)
        y = rng.standard_normal((batch, widths[-1])).astype(dtype)
        want, got = (float(step(x, y)) for step in steps)
        np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    for a, b in zip(*(m.parameters() for m in models)):
        np.testing.assert_allclose(b.data, a.data, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def _interrupt_after(seconds):
    """A SIGINT to this process ``seconds`` from now (SIGALRM's handler raises it where it lands)."""
    signal.signal(signal.SIGALRM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    signal.setitimer(signal.ITIMER_REAL, seconds)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@settings(max_examples=3, derandomize=True, deadline=None)
@given(delays=st.lists(st.floats(1e-5, 2e-3), min_size=15, max_size=15))
def test_ctrl_c_at_random_points_never_tears_a_step(backend, delays):
    """Every parameter saw the same number of steps, however the interrupts fall."""
    np.random.seed(0)
    model = MLP(2, [2] * 6 + [1])
    opt = Adam(model.parameters(), lr=1e-3)
    step = jit(train_step(model, opt), backend=backend)
    x, y = np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)
    step(x, y)
    alarm = signal.getsignal(signal.SIGALRM)
    try:
        for delay in delays:
            try:
                _interrupt_after(delay)
                for _ in range(200):  # until the interrupt lands (one that lands in a finalizer is lost)
                    step(x, y)
            except KeyboardInterrupt:
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
    counts = {float(slot["step"].data) for slot in opt.state.values()}  # Adam's per-parameter step count
    assert len(counts) == 1, f"parameters saw different numbers of steps: {sorted(counts)}"


def _lines_run_by(call) -> list[tuple[str, int]]:
    """The (file, line) of every Python line ``call()`` executes in this thread, in order."""
    lines = []

    def tracer(frame, event, arg):
        if event == "line":
            lines.append((frame.f_code.co_filename, frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


def _signals_delivered() -> None:
    """A Python call: a SIGINT still pending is handled here at the latest."""


def _ctrl_c_on_line(call, line: int) -> bool | None:
    """Run ``call()`` with a SIGINT raised when it reaches its ``line``-th Python line (the
    handler runs where Python next checks for signals, as for a real Ctrl-C); whether a
    KeyboardInterrupt came out, None if the call ended before that line."""
    seen = 0

    def tracer(frame, event, arg):
        nonlocal seen
        if seen >= line:
            return None
        seen += event == "line"
        if seen == line:
            signal.raise_signal(signal.SIGINT)
        return tracer

    try:
        sys.settrace(tracer)
        try:
            call()
        finally:
            sys.settrace(None)
        _signals_delivered()
    except KeyboardInterrupt:
        return True
    return False if seen >= line else None


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_ctrl_c_on_every_line_of_a_step_never_tears_it_nor_is_lost(backend):
    """A Ctrl-C landing on any Python line a step runs (its own code, the optimizer's
    hyperparameter sources that the native call reads, NumPy's Python code: every line at
    its first, middle and last run) raises KeyboardInterrupt, and every parameter saw the
    same number of steps."""
    np.random.seed(0)
    model = MLP(2, [2] * 3 + [1])
    opt = Adam(model.parameters(), lr=1e-3)
    step = jit(train_step(model, opt), backend=backend)
    x, y = np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)
    step(x, y)  # compiled (blocking) before lines are counted
    gc.collect()  # no other test's garbage, whose finalizers would add traced lines to some calls
    gc.disable()
    try:
        _every_line_interrupted(step, opt, x, y)
    finally:
        gc.enable()


def _every_line_interrupted(step, opt, x, y) -> None:
    """``step(x, y)`` interrupted at the first, middle and last run of each Python line it runs."""
    lines = _lines_run_by(lambda: step(x, y))
    runs: dict[tuple[str, int], list[int]] = {}
    for position, site in enumerate(lines, start=1):
        runs.setdefault(site, []).append(position)
    chosen = {p for positions in runs.values() for p in (positions[0], positions[len(positions) // 2], positions[-1])}
    reached = 0
    for line in sorted(chosen):
        file, number = lines[line - 1]
        where = f"Ctrl-C on line {line} of {len(lines)} ({file.rsplit('/', 1)[-1]}:{number})"
        interrupted = _ctrl_c_on_line(lambda: step(x, y), line)
        assert interrupted is not False, f"{where} was lost"
        reached += interrupted is True  # None: this call ran fewer lines (a cache or warning path differed)
        counts = sorted(float(slot["step"].data) for slot in opt.state.values())
        assert len(set(counts)) == 1, f"{where}: step counts {counts}"
    assert reached >= 0.9 * len(chosen)
