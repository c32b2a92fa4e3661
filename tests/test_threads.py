"""Threads: tracing is per thread, and first calls may overlap eager work or each other."""

import gc
import sys
import threading

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.engine import Tensor
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step


@pytest.fixture
def tiny_switch_interval():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def run_threads(*targets):
    """Run each target in its own thread; fail on any exception, including ones raised
    where nobody can catch them (e.g. by the garbage collector)."""
    errors = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda report: errors.append(report.exc_value)

    def guarded(target):
        try:
            target()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(timeout=120)
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def eager_training(model, steps, x, y):
    step = train_step(model, SGD(model.parameters(), lr=0.05))
    for _ in range(steps):
        step(Tensor(x), Tensor(y))


def test_tracing_in_one_thread_does_not_capture_eager_work_in_another(tiny_switch_interval):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 2)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    eager_model, solo_model = MLP(2, [6, 1]), MLP(2, [6, 1])
    for a, b in zip(eager_model.parameters(), solo_model.parameters()):
        b.data[...] = a.data
    eager_training(solo_model, 30, x, y)  # the same training with no other thread around
    traced_models = [MLP(2, [4, 1]) for _ in range(12)]

    def tracer():
        for model in traced_models:
            jit(train_step(model, SGD(model.parameters(), lr=0.1)), backend="numpy").lower(x, y)

    run_threads(tracer, lambda: eager_training(eager_model, 30, x, y))
    for a, b in zip(eager_model.parameters(), solo_model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_overlapping_first_calls_train_their_own_models(tiny_switch_interval):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 2)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    models = [MLP(2, [21 + i, 1]) for i in range(3)]  # sizes no other test uses: egglog runs here
    twins = [MLP(2, [21 + i, 1]) for i in range(3)]
    for m, t in zip(models, twins):
        for a, b in zip(m.parameters(), t.parameters()):
            b.data[...] = a.data
        eager_training(t, 3, x, y)

    def trainer(model):
        step = jit(train_step(model, SGD(model.parameters(), lr=0.05)), backend="cpu")
        for _ in range(3):
            step(x, y)

    run_threads(*[lambda m=m: trainer(m) for m in models])
    for m, t in zip(models, twins):
        for a, b in zip(m.parameters(), t.parameters()):
            np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6)


def test_one_step_first_called_from_several_threads_is_traced_once(tiny_switch_interval):
    model = MLP(2, [4, 1])
    step = jit(train_step(model, SGD(model.parameters(), lr=0.0)), backend="numpy")
    x, y = np.ones((3, 2), np.float32), np.ones((3, 1), np.float32)
    losses = []
    run_threads(*[lambda: losses.append(float(step(x, y))) for _ in range(4)])
    assert len(step._cache) == 1 and len(set(losses)) == 1
