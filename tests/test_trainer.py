"""Trainer: the seed's moons example and the bad input it must refuse."""

import random
import time

import numpy as np
import pytest
from sklearn.datasets import make_moons

from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import Trainer


def test_moons_example_trains_to_high_accuracy(tmp_path):
    X, y = make_moons(n_samples=100, noise=0.1, random_state=42)
    model = MLP(nin=2, nouts=[32, 32, 16, 1])
    trainer = Trainer(model, SGD(model.parameters(), lr=0.005), backend="numpy")
    start = time.perf_counter()
    history = trainer.train(X, y, n_epochs=500, batch_size=10, verbose=False)
    elapsed = time.perf_counter() - start
    assert max(history["accuracies"]) >= 0.95 and history["accuracies"][-1] >= 0.95
    assert history["losses"][-1] < history["losses"][0]
    assert elapsed < 60
    trainer.plot_training_progress(str(tmp_path / "progress.png"))
    trainer.plot_decision_boundary(X, y, str(tmp_path / "boundary.png"))
    assert (tmp_path / "progress.png").stat().st_size > 1000
    assert (tmp_path / "boundary.png").stat().st_size > 1000


def test_short_last_batch_and_many_features():
    X = np.random.randn(23, 5)
    y = (X[:, 0] > 0).astype(int)
    model = MLP(5, [8, 1])
    history = Trainer(model, SGD(model.parameters(), lr=0.01)).train(X, y, n_epochs=3, batch_size=10,
                                                                      verbose=False)
    assert len(history["losses"]) == 3 and 0 <= history["accuracies"][-1] <= 1


def test_numpy_integers_are_accepted_as_sizes():
    X, y = np.random.randn(12, 2), np.ones(12)
    model = MLP(2, [3, 1])
    history = Trainer(model, SGD(model.parameters()), backend="numpy").train(
        X, y, n_epochs=np.int64(2), batch_size=np.int64(4), verbose=False)
    assert len(history["losses"]) == 2


@pytest.mark.parametrize("X,y,kwargs,error,match", [
    (np.ones((4, 2)), np.ones(4), {"batch_size": 0}, ValueError, "batch_size must be a positive integer"),
    (np.ones((4, 2)), np.ones(4), {"batch_size": 2.0}, ValueError, "batch_size must be a positive integer"),
    (np.ones((4, 2)), np.ones(4), {"n_epochs": 1.5}, ValueError, "n_epochs must be an integer"),
    (np.ones((0, 2)), np.ones(0), {}, ValueError, "X is empty"),
    (np.ones((4, 2)), np.ones(3), {}, ValueError, r"len\(X\) = 4 but len\(y\) = 3"),
    (np.array([[1.0, np.nan]]), np.ones(1), {}, ValueError, "X contains NaN"),
    ([["a", "b"]], [1], {}, TypeError, "must be numeric"),
    (np.ones((4, 3)), np.ones(4), {}, ValueError, r"Layer: input has shape \(N, 3\), expected \(batch, 2\)"),
])
def test_bad_input_is_refused_and_parameters_stay(X, y, kwargs, error, match):
    model = MLP(2, [4, 1])
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(error, match=match):
        Trainer(model, SGD(model.parameters())).train(X, y, verbose=False, **kwargs)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


def test_optimizer_on_and_off_train_alike():
    X, y = make_moons(n_samples=40, noise=0.1, random_state=1)
    histories = []
    for optimize in (True, False):
        np.random.seed(3)
        model = MLP(2, [8, 1], dtype=np.float64)
        trainer = Trainer(model, SGD(model.parameters(), lr=0.01), backend="numpy", optimize=optimize)
        random.seed(0)
        histories.append(trainer.train(X, y, n_epochs=5, batch_size=8, verbose=False)["losses"])
        assert trainer._step.optimize is optimize
    np.testing.assert_allclose(histories[0], histories[1], rtol=1e-9)
