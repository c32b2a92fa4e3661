"""Parameters and optimizer state resident on the GPU (mlir_nn.runtime.residency): how many copies
a step makes, and that the values agree with the NumPy reference. Needs a GPU; the
contract tests shared with the host backends are in tests/test_trainer_resident.py."""

import random

import numpy as np
import pytest

import mlir_nn
from mlir_nn.ir import ShapeError
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.runtime import residency
from mlir_nn.trainer import Trainer, train_step
from tests.gpu.device import needs_gpu

pytestmark = needs_gpu
RTOL, ATOL = 2e-3, 2e-4  # float32, sums in a different order than NumPy's


def cuda_steps(function):
    """The CudaSteps behind a jit function (one per traced signature)."""
    return [compiled.executable.step for compiled in function._cache.values()]


def sgd_step(seed, backend="cuda", **options):
    """(model, jit step) of a seeded MLP 2-7-1 trained with SGD(lr=0.1, **options) on ``backend``."""
    np.random.seed(seed)
    model = MLP(2, [7, 1])
    return model, mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1, **options)), backend=backend)


def data(n=57, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2)).astype(np.float32)
    return X, (X[:, :1] * X[:, 1:] > 0).astype(np.float32)


def test_a_trainer_copies_each_parameter_once_per_train_call():
    np.random.seed(0)
    model = MLP(2, [13, 7, 1])
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer = Trainer(model, opt, backend="cuda")
    X, y = data()
    trainer.train(X, y[:, 0], n_epochs=3, batch_size=10, verbose=False, early_stopping=False)  # 18 steps
    (step,) = cuda_steps(next(iter(trainer._steps.values())))
    n_updated = len(step.update_slots)  # 6 weights and biases, 6 momentum buffers
    assert n_updated == 12
    # uploaded by the first step (hyperparameters too), written back once when train() returned
    assert step.param_copies == {"to_device": len(step.param_shapes), "to_host": n_updated}
    trainer.train(X, y[:, 0], n_epochs=1, batch_size=10, verbose=False, early_stopping=False)
    assert step.param_copies == {"to_device": 2 * len(step.param_shapes), "to_host": 2 * n_updated}


def test_validation_fetches_the_weights_once_per_epoch():
    np.random.seed(0)
    model = MLP(2, [13, 7, 1])
    trainer = Trainer(model, SGD(model.parameters(), lr=0.05), backend="cuda")
    X, y = data()
    trainer.train(X, y[:, 0], n_epochs=3, batch_size=10, verbose=False, early_stopping=False,
                  validation_data=(X[:20], y[:20, 0]))
    (step,) = cuda_steps(next(iter(trainer._steps.values())))
    (forward,) = cuda_steps(trainer._forward)
    weights = len(model.parameters())
    assert forward.param_copies == {"to_device": 3 * weights, "to_host": 0}
    # each validation fetched the weights; at the end of train() nothing newer was left
    assert step.param_copies["to_host"] == 3 * weights
    assert step.param_copies["to_device"] == len(step.param_shapes)


@pytest.mark.parametrize("optimizer", [SGD, Adam])
def test_a_jit_step_in_a_resident_block_matches_the_reference(optimizer):
    results = []
    for backend in ("cuda", "numpy"):
        np.random.seed(1)
        model = MLP(2, [33, 1])
        opt = optimizer(model.parameters(), lr=0.01)
        step = mlir_nn.jit(train_step(model, opt), backend=backend)
        start = [p.data.copy() for p in model.parameters()]
        X, y = data(13)
        losses = []
        with mlir_nn.resident():
            for i in range(6):  # from the third call on, a replayed CUDA graph
                if i == 4:
                    opt.lr = 0.002  # a hyperparameter change reaches the device
                losses.append(float(step(X, y)))
            if backend == "cuda":
                assert all(np.array_equal(p.data, s) for p, s in zip(model.parameters(), start))  # still on the device
                (cuda_step,) = cuda_steps(step)
                assert cuda_step.param_copies["to_host"] == 0
            mlir_nn.sync()
            synced = [p.data.copy() for p in model.parameters()]
            for p, s in zip(model.parameters(), start):  # after sync(), host writes are what the next step uses
                p.data[...] = s
            losses.append(float(step(X, y)))
        results.append((losses, synced, [p.data.copy() for p in model.parameters()]))
    (got_losses, *got), (want_losses, *want) = results
    np.testing.assert_allclose(got_losses, want_losses, rtol=RTOL)
    assert got_losses[-1] == pytest.approx(got_losses[0], rel=1e-5)  # restarted from the start values
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    assert residency.LEDGER.holders() == set()


def test_a_jit_step_outside_a_block_copies_every_call_and_honours_writes():
    model, step = sgd_step(2)
    X, y = data(7)
    for _ in range(3):
        step(X, y)
    (cuda_step,) = cuda_steps(step)
    n = len(cuda_step.param_shapes)
    assert cuda_step.param_copies == {"to_device": 3 * n, "to_host": 3 * len(cuda_step.update_slots)}
    for p in model.parameters():
        p.data[...] = 0
    loss = float(step(X, y))
    assert loss == pytest.approx(float(np.mean(y ** 2)), rel=1e-5)  # the zero model's loss


def test_bad_input_is_refused_before_the_device_and_the_state_survives():
    model, step = sgd_step(3)
    X, y = data(7)
    with pytest.raises(ShapeError):
        with mlir_nn.resident():
            step(X, y)
            step(X, y)
            (cuda_step,) = cuda_steps(step)
            copies = dict(cuda_step.param_copies)
            bad = np.where(np.arange(7)[:, None] == 3, np.nan, X)
            with pytest.raises(ValueError, match="NaN"):
                step(bad, y)
            assert cuda_step.param_copies == copies  # nothing was copied for the refused call
            step(X, y[:3])  # another batch size for y than for X
    reference, ref_step = sgd_step(3, backend="numpy")
    ref_step(X, y)
    ref_step(X, y)
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.data, q.data, rtol=RTOL, atol=ATOL)


def test_a_trainer_on_cuda_matches_the_reference_over_a_few_epochs():
    results = []
    for backend in ("cuda", "numpy"):
        np.random.seed(4)
        model = MLP(2, [32, 32, 16, 1])
        trainer = Trainer(model, Adam(model.parameters(), lr=0.01), backend=backend)
        X, y = data(100)
        random.seed(4)
        history = trainer.train(X, y[:, 0], n_epochs=5, batch_size=10, verbose=False, early_stopping=False)
        results.append((history["losses"], [p.data.copy() for p in model.parameters()]))
    (got_losses, got), (want_losses, want) = results
    np.testing.assert_allclose(got_losses, want_losses, rtol=RTOL)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_load_state_dict_inside_a_block_is_what_the_next_step_uses():
    model, step = sgd_step(5, momentum=0.9)
    X, y = data(13)
    start = model.state_dict()
    with mlir_nn.resident():
        first = float(step(X, y))
        step(X, y)
        saved = model.state_dict()  # fetched from the device: the values after two steps
        step(X, y)
        model.load_state_dict(start)  # no sync() needed: the device copies of the weights are stale now
        again = float(step(X, y))
    assert again == pytest.approx(first, rel=1e-5)
    assert not all(np.allclose(saved[k], start[k]) for k in start)
    assert not all(np.allclose(model.state_dict()[k], start[k]) for k in start)  # the last step's values came back
