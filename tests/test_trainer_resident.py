"""The Trainer's state contract on every backend, against the NumPy reference: p.data is
current after train() (also after an interrupted one), validation sees the current
parameters, and whatever the host holds between train() calls is what training starts
from. On cuda the state stays on the device during train() (mlir_nn.runtime.residency), so these
check its copies back and forth; on the host backends the same contract holds trivially."""

import random

import numpy as np
import pytest
from sklearn.datasets import make_moons

import mlir_nn
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import Trainer
from tests.gpu.device import needs_gpu

RTOL, ATOL = 2e-3, 2e-4  # float32, a few epochs of a small MLP, sums in a different order (as gpu_check)
BACKENDS = ["cpu", pytest.param("cuda", marks=needs_gpu)]


def moons():
    X, y = make_moons(n_samples=57, noise=0.1, random_state=3)  # batches of 10: a short last batch of 7
    return X, y


def make(backend, seed=0, momentum=0.9):
    np.random.seed(seed)
    model = MLP(2, [13, 7, 1])
    opt = SGD(model.parameters(), lr=0.05, momentum=momentum)
    return model, opt, Trainer(model, opt, backend=backend)


def state_of(model, opt):
    return [p.data.copy() for p in model.parameters()] + \
        [t.data.copy() for slot in opt.state.values() for t in slot.values()]


def assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


class InterruptAt:
    """mse_loss, with training interrupted (as by Ctrl-C) when the Trainer reads it for batch ``n``."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __call__(self, pred, target):
        return mse_loss(pred, target)

    def __bool__(self):  # the Trainer reads its loss_fn once per batch
        self.reads += 1
        if self.reads == self.n:
            raise KeyboardInterrupt
        return True


def train_like_reference(backend, **train_kwargs):
    """(backend's result, the reference's result) of the same training run: (history, state)."""
    results = []
    for name in (backend, "numpy"):
        model, opt, trainer = make(name)
        random.seed(1)
        history = trainer.train(*moons(), batch_size=10, verbose=False, early_stopping=False, **train_kwargs)
        results.append((history, state_of(model, opt)))
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_leaves_p_data_current_and_validation_sees_the_current_parameters(backend):
    X, y = moons()
    (got, got_state), (want, want_state) = train_like_reference(backend, n_epochs=4, validation_data=(X[:20], y[:20]))
    assert_close(got_state, want_state)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=RTOL)
    np.testing.assert_allclose(got["val_losses"], want["val_losses"], rtol=RTOL)
    assert len(set(np.round(got["val_losses"], 6))) == 4  # each epoch's validation saw new parameters


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_interrupted_train_leaves_the_last_completed_step_in_p_data(backend):
    results = []
    for name in (backend, "numpy"):
        model, opt, trainer = make(name)
        trainer.loss_fn = InterruptAt(9)  # 8 steps: one epoch of 6 batches, then 2 more
        random.seed(1)
        with pytest.raises(KeyboardInterrupt):
            trainer.train(*moons(), n_epochs=3, batch_size=10, verbose=False)
        results.append(state_of(model, opt))
    assert_close(*results)
    model, opt, _ = make("numpy")
    assert not np.allclose(results[1][0], model.parameters()[0].data)  # the steps did change the weights


def write_host(how, model, opt, state, tmp_path):
    """Put ``state`` (parameters, then momentum buffers) into the host copies, one way or another."""
    params, buffers = state[:len(model.parameters())], state[len(model.parameters()):]
    if how == "p.data":
        for p, value in zip(model.parameters(), params):
            p.data[...] = value
        for t, value in zip([t for slot in opt.state.values() for t in slot.values()], buffers):
            t.data[...] = value
        return
    source_model, source_opt, _ = make("numpy")
    for p, value in zip(source_model.parameters(), params):
        p.data[...] = value
    random.seed(5)
    Trainer(source_model, source_opt, backend="numpy").train(*moons(), n_epochs=1, verbose=False)  # makes buffers
    for t, value in zip([t for slot in source_opt.state.values() for t in slot.values()], buffers):
        t.data[...] = value
    source_model.load_state_dict(dict(zip(source_model.state_dict(), params)))
    if how == "load_state_dict":
        model.load_state_dict(source_model.state_dict())
        opt.load_state_dict(source_opt.state_dict())
    else:
        mlir_nn.save({"model": source_model.state_dict(), "opt": source_opt.state_dict()}, tmp_path / "ckpt.npz")
        checkpoint = mlir_nn.load(tmp_path / "ckpt.npz")
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])


@pytest.mark.parametrize("how", ["p.data", "load_state_dict", "checkpoint"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_what_the_host_holds_between_train_calls_is_what_training_starts_from(backend, how, tmp_path):
    reference_model, reference_opt, reference = make("numpy", seed=1)
    random.seed(2)
    reference.train(*moons(), n_epochs=1, verbose=False)  # an optimizer state to start from
    start = state_of(reference_model, reference_opt)
    random.seed(3)
    reference.train(*moons(), n_epochs=2, batch_size=10, verbose=False, early_stopping=False)
    want = state_of(reference_model, reference_opt)

    model, opt, trainer = make(backend, seed=2)
    random.seed(4)
    trainer.train(*moons(), n_epochs=1, verbose=False)  # other values, now on the device for cuda
    write_host(how, model, opt, start, tmp_path)
    assert_close(state_of(model, opt), start)
    random.seed(3)
    trainer.train(*moons(), n_epochs=2, batch_size=10, verbose=False, early_stopping=False)
    assert_close(state_of(model, opt), want)
