"""Property-based bad input: every drawn mistake is a clear Python exception raised before
anything runs, and leaves the parameters and the optimizer state exactly as they were."""

from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import train_step

NIN, NOUT = 3, 2


@cache
def trained_step(backend):
    """A step that has run once (so optimizer state exists), per backend."""
    np.random.seed(0)
    model = MLP(NIN, [5, NOUT])
    opt = Adam(model.parameters(), lr=0.01)
    step = jit(train_step(model, opt), backend=backend)
    step(np.ones((4, NIN), np.float32), np.ones((4, NOUT), np.float32))
    return step, model, opt


def snapshot(model, opt):
    state = [t.data.copy() for slot in opt.state.values() for t in slot.values()]
    return [p.data.copy() for p in model.parameters()] + state, (opt.lr, opt.betas, opt.eps)


def good(batch, rng):
    return rng.standard_normal((batch, NIN)).astype(np.float32), rng.standard_normal((batch, NOUT)).astype(np.float32)


def non_finite(which, value, batch, rng):
    x, y = good(batch, rng)
    target = x if which == "x" else y
    target.flat[rng.integers(target.size)] = value
    return (x, y), {}


MISTAKES = {
    "too many features": lambda b, rng: ((good(b, rng)[0][:, [0, 1, 2, 0]], good(b, rng)[1]), {}),
    "too few features": lambda b, rng: ((good(b, rng)[0][:, :2], good(b, rng)[1]), {}),
    "wrong target width": lambda b, rng: ((good(b, rng)[0], np.ones((b, NOUT + 1), np.float32)), {}),
    "batch sizes differ": lambda b, rng: ((good(b, rng)[0], good(b + 1, rng)[1]), {}),
    "empty batch": lambda b, rng: ((np.ones((0, NIN), np.float32), np.ones((0, NOUT), np.float32)), {}),
    "NaN input": lambda b, rng: non_finite("x", np.nan, b, rng),
    "inf target": lambda b, rng: non_finite("y", -np.inf, b, rng),
    "complex input": lambda b, rng: ((good(b, rng)[0] + 1j, good(b, rng)[1]), {}),
    "strings": lambda b, rng: ((np.full((b, NIN), "a"), good(b, rng)[1]), {}),
    "None": lambda b, rng: ((None, good(b, rng)[1]), {}),
    "objects": lambda b, rng: ((np.array([[object()] * NIN] * b), good(b, rng)[1]), {}),
    "scalar input": lambda b, rng: ((1.0, good(b, rng)[1]), {}),
    "3-d input": lambda b, rng: ((np.ones((b, NIN, 1), np.float32), good(b, rng)[1]), {}),
    "one argument": lambda b, rng: ((good(b, rng)[0],), {}),
    "three arguments": lambda b, rng: (good(b, rng) + (good(b, rng)[0],), {}),
    "unknown keyword": lambda b, rng: ((good(b, rng)[0],), {"target": good(b, rng)[1]}),
}


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@settings(max_examples=40, derandomize=True, deadline=None)
@given(mistake=st.sampled_from(sorted(MISTAKES)), batch=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_bad_input_raises_and_changes_nothing(backend, mistake, batch, seed):
    step, model, opt = trained_step(backend)
    args, kwargs = MISTAKES[mistake](batch, np.random.default_rng(seed))
    arrays, hyper = snapshot(model, opt)
    with pytest.raises((TypeError, ValueError)) as raised:
        step(*args, **kwargs)
    assert len(str(raised.value)) > 10  # says what was wrong
    after, hyper_after = snapshot(model, opt)
    assert hyper_after == hyper and len(after) == len(arrays)
    for a, b in zip(arrays, after):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=30, derandomize=True, deadline=None)
@given(name=st.sampled_from(["lr", "eps", "betas"]),
       value=st.one_of(st.sampled_from([np.nan, np.inf, -np.inf, -1.0, "0.1", None, (0.9,), (0.9, 1.0), (-0.1, 0.9)]),
                       st.floats(max_value=-1e-12)))
def test_bad_hyperparameters_are_refused_and_change_nothing(name, value):
    step, model, opt = trained_step("numpy")
    before = getattr(opt, name)
    with pytest.raises((TypeError, ValueError), match=name):
        setattr(opt, name, value)
    assert getattr(opt, name) == before
