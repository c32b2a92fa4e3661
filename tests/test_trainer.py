"""Trainer: the seed's moons example, every target shape, validation, and the bad input it must refuse."""

import random
import subprocess
import sys
import time

import numpy as np
import pytest
from sklearn.datasets import make_moons

from mlir_nn.losses import cross_entropy, mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
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
    figure = trainer.plot_decision_boundary(X, y, str(tmp_path / "boundary.png"))
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert len(legend) == 3 and legend[-1] == "decision boundary (output 0)" and legend[0].startswith("class ")
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
    (np.ones((4, 3)), np.ones(4), {}, ValueError, r"Layer: input has shape \(1, 3\), expected \(batch, 2\)"),
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
        assert [s.optimize for s in trainer._steps.values()] == [optimize]
    np.testing.assert_allclose(histories[0], histories[1], rtol=1e-9)


def _blobs(n: int, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = np.array([[3.0 * np.cos(2 * np.pi * c / classes), 3.0 * np.sin(2 * np.pi * c / classes)]
                        for c in range(classes)])
    return centres[labels] + rng.standard_normal((n, 2)) * 0.5, labels


@pytest.mark.parametrize("one_hot", [False, True], ids=["labels", "one-hot"])
def test_multiclass_with_labels_or_one_hot(one_hot):
    """Issue 10, defect 2: one-hot targets are not binary labels; argmax accuracy, cross-entropy."""
    X, labels = _blobs(90)
    y = np.eye(3)[labels] if one_hot else labels
    np.random.seed(0)
    random.seed(0)
    model = MLP(2, [16, 3])
    trainer = Trainer(model, Adam(model.parameters(), lr=0.05), backend="numpy")
    history = trainer.train(X, y, n_epochs=15, batch_size=16, verbose=False)
    assert all(0 <= a <= 1 for a in history["accuracies"]) and history["accuracies"][-1] >= 0.95
    assert list(trainer._steps) == [cross_entropy]
    pred = trainer.predict(X)
    assert history["accuracies"][-1] == pytest.approx(np.mean(np.argmax(pred, 1) == labels), abs=0.1)


def test_binary_labels_as_a_column_and_as_plus_minus_one():
    """Issue 10, defect 2: y of shape (N, 1) gave accuracies of 11-14."""
    X, y = make_moons(n_samples=60, noise=0.1, random_state=0)
    for labels in (y.reshape(-1, 1), np.where(y == 1, 1, -1)):
        np.random.seed(0)
        model = MLP(2, [16, 1])
        history = Trainer(model, Adam(model.parameters(), lr=0.02), backend="numpy").train(
            X, labels, n_epochs=20, batch_size=10, verbose=False)
        assert all(0 <= a <= 1 for a in history["accuracies"]) and history["accuracies"][-1] >= 0.8


def test_regression_reports_no_accuracy():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3
    model = MLP(3, [1])
    history = Trainer(model, SGD(model.parameters(), lr=0.05), backend="numpy").train(
        X, y, n_epochs=30, batch_size=8, verbose=False)
    assert history["accuracies"] == [None] * 30 and history["losses"][-1] < 0.01 * history["losses"][0]


def test_epoch_loss_weights_batches_by_their_size():
    """Issue 10, defect 3: 33 samples in batches of 32 reported the sum of two batch losses."""
    X, y = np.random.default_rng(1).standard_normal((33, 2)), np.arange(33.0) / 10
    model = MLP(2, [1], dtype=np.float64)
    trainer = Trainer(model, SGD(model.parameters(), lr=1e-12), backend="numpy")  # parameters barely move
    history = trainer.train(X, y, n_epochs=1, batch_size=32, verbose=False)
    full = float(mse_loss(model(X), y.reshape(-1, 1)).data)
    assert history["losses"][0] == pytest.approx(full, rel=1e-6)


def test_data_is_checked_in_the_models_dtype_before_the_first_step():
    """Issue 10, defect 4: 1e39 is finite in float64 but inf in float32."""
    X, y = np.ones((1000, 2)), np.tile([0.0, 1.0], 500)
    X[999, 0] = 1e39
    model = MLP(2, [4, 1])
    before = [p.data.copy() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"X contains NaN or infinite values as float32"):
        Trainer(model, SGD(model.parameters()), backend="numpy").train(X, y, verbose=False)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)


def test_changing_loss_fn_after_construction_takes_effect():
    """Issue 10, defect 6: the article's Trainer reads loss_fn at every batch."""
    X, y = make_moons(n_samples=20, noise=0.1, random_state=0)
    model = MLP(2, [4, 1])
    trainer = Trainer(model, SGD(model.parameters(), lr=0.01), backend="numpy")
    calls = []

    def doubled(pred, target):
        calls.append(1)
        return mse_loss(pred, target) * 2.0

    trainer.train(X, y, n_epochs=1, verbose=False)
    trainer.loss_fn = doubled
    trainer.train(X, y, n_epochs=1, verbose=False)
    assert calls and list(trainer._steps) == [mse_loss, doubled]


def test_validation_data_and_early_stopping_on_it():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, 120)
    X = np.eye(3)[labels][:, :2] + rng.standard_normal((120, 2))  # overlapping classes: a big MLP overfits
    np.random.seed(0)
    random.seed(0)
    model = MLP(2, [64, 64, 3])
    trainer = Trainer(model, Adam(model.parameters(), lr=0.003), backend="numpy")
    history = trainer.train(X[:60], labels[:60], n_epochs=200, batch_size=16, verbose=False,
                            validation_data=(X[60:], labels[60:]), patience=3)
    n = len(history["losses"])
    assert 3 < n < 200 and len(history["val_losses"]) == len(history["val_accuracies"]) == n
    best = int(np.argmin(history["val_losses"]))
    assert n == best + 1 + 3  # stopped after 3 epochs without a better validation loss
    pred = trainer.predict(X[60:])
    assert history["val_accuracies"][-1] == np.mean(np.argmax(pred, 1) == labels[60:])
    assert history["val_losses"][-1] == pytest.approx(float(cross_entropy(pred.astype(np.float64), labels[60:]).data),
                                                      rel=1e-5)


def test_progress_bar_when_verbose_and_silence_when_not(capsys):
    X, y = make_moons(n_samples=20, noise=0.1, random_state=0)
    model = MLP(2, [4, 1])
    trainer = Trainer(model, SGD(model.parameters(), lr=0.01), backend="numpy")
    trainer.train(X, y, n_epochs=3, verbose=False)
    assert capsys.readouterr() == ("", "")
    trainer.train(X, y, n_epochs=3, verbose=True, validation_data=(X, y))
    out, err = capsys.readouterr()
    assert "3/3" in err and "loss=" in err and "acc=" in err and "val_loss=" in err
    assert "Final accuracy:" in out


def test_multiclass_labels_out_of_range_are_refused():
    model = MLP(2, [4, 3])
    with pytest.raises(ValueError, match=r"labels must be integers in \[0, 3\) for a model with 3 outputs"):
        Trainer(model, SGD(model.parameters()), backend="numpy").train(np.ones((4, 2)), [0, 1, 2, 3], verbose=False)


QUIET_WITHOUT_TQDM = """
import sys
sys.modules["tqdm"] = None  # as on a machine without tqdm: importing it fails
import numpy as np
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import Trainer
model = MLP(2, [4, 1])
history = Trainer(model, SGD(model.parameters(), lr=0.1), backend="numpy").train(
    np.random.randn(20, 2), np.random.randint(0, 2, 20), n_epochs=2, verbose=False)
print(len(history["losses"]))
"""


def test_quiet_training_needs_no_tqdm():
    done = subprocess.run([sys.executable, "-c", QUIET_WITHOUT_TQDM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr[-2000:]
