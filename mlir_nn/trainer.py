"""Trainer: tinynn's training loop, one compiled step per mini-batch."""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.jit import JitFunction
from mlir_nn.losses import cross_entropy, mse_loss
from mlir_nn.nn import Module
from mlir_nn.optim import Optimizer
from mlir_nn.runtime import residency


def train_step(model: Module, optimizer: Optimizer,
               loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
               return_prediction: bool = False) -> Callable[[Tensor, Tensor], Any]:
    """The eager-style training step that ``mlir_nn.jit`` compiles: forward, loss,
    backward, update. It returns the loss, or (loss, prediction)."""
    loss_fn = loss_fn or mse_loss

    def step(x: Tensor, y: Tensor) -> Any:
        pred = model(x)
        loss = loss_fn(pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return (loss, pred) if return_prediction else loss

    return step


def _as_arrays(X: Any, y: Any, dtype: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) as ``dtype`` arrays, checked as training will use them (after the cast)."""
    where = f"Trainer.train: {what} " if what else "Trainer.train: "
    try:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}X and y must be numeric arrays: {e}") from None
    if X.ndim == 1:
        X = X.reshape(-1, 1)
    if X.ndim != 2:
        raise ValueError(f"{where}X must have shape (samples, features), got {X.shape}")
    if len(X) == 0:
        raise ValueError(f"{where}X is empty (shape {X.shape})")
    if y.ndim not in (1, 2) or len(y) != len(X):
        raise ValueError(f"{where}len(X) = {len(X)} but len(y) = {len(y) if y.ndim else 0} (shape {y.shape}); "
                         "expected one label or target row per sample")
    with np.errstate(over="ignore"):  # overflow to inf is what the check below reports
        X, y = X.astype(dtype), y.astype(dtype)
    for name, arr in (("X", X), ("y", y)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{where}{name} contains NaN or infinite values as {dtype} "
                             "(the model's dtype); refusing to train on them")
    return X, y


def _check_data(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    return _as_arrays(X, y, "float64", "")


class Task:
    """What (X, y) asks for: binary, multi-class or regression, given the model's output width.

    * binary: one output, labels in {0, 1} or {-1, +1}: targets are -1 / +1 and a sample is
      class 1 when the output is > 0 (tinynn); mse by default;
    * multiclass: C > 1 outputs and integer labels (N,) in [0, C) or one-hot rows (N, C):
      argmax accuracy, cross-entropy by default;
    * regression: anything else; accuracy is None.
    """

    def __init__(self, y: np.ndarray, outputs: int) -> None:
        values = np.unique(y)
        column = y.reshape(len(y)) if y.ndim == 1 or y.shape[1] == 1 else None
        integral = bool(np.all(values == np.round(values)))
        one_hot = y.ndim == 2 and y.shape[1] == outputs > 1 and bool(np.isin(values, (0, 1)).all()) \
            and bool(np.all(y.sum(axis=1) == 1))
        if outputs == 1 and column is not None and (np.isin(values, (0, 1)).all() or np.isin(values, (-1, 1)).all()):
            self.kind = "binary"
        elif outputs > 1 and column is not None and integral and values.min() >= 0 and values.max() < outputs:
            self.kind = "multiclass"
        elif one_hot:
            self.kind = "multiclass"
        elif outputs > 1 and column is not None and integral:
            raise ValueError(f"Trainer.train: labels must be integers in [0, {outputs}) for a model with {outputs} "
                             f"outputs, got values in [{values.min():g}, {values.max():g}]")
        else:
            self.kind = "regression"
        self.column, self.outputs = column, outputs

    def targets(self, y: np.ndarray) -> np.ndarray:
        """What the loss sees: +-1 (binary), labels (N,) or one-hot rows as given, y as (N, outputs)."""
        if self.kind == "binary":
            return np.where(y.reshape(len(y), 1) == 1, 1.0, -1.0).astype(y.dtype)
        if self.kind == "multiclass":
            return y.reshape(len(y)) if y.ndim == 1 or y.shape[1] == 1 else y
        return y.reshape(len(y), -1)

    def default_loss(self) -> Callable[[Tensor, Tensor], Tensor]:
        return cross_entropy if self.kind == "multiclass" else mse_loss

    def correct(self, pred: np.ndarray, y: np.ndarray) -> int:
        """How many rows of ``pred`` get their label in ``y`` right (0 for regression)."""
        if self.kind == "binary":
            return int(np.sum((pred[:, 0] > 0) == (y.reshape(len(y)) == 1)))
        if self.kind == "multiclass":
            labels = y.reshape(len(y)) if y.ndim == 1 or y.shape[1] == 1 else np.argmax(y, axis=1)
            return int(np.sum(np.argmax(pred, axis=1) == labels))
        return 0


class _NoBar:
    """The progress bar of a quiet ``train``: takes the same calls, shows nothing."""

    def set_postfix(self, values: dict[str, str], refresh: bool = False) -> None:
        pass

    def update(self) -> None:
        pass

    def close(self) -> None:
        pass


class Trainer:
    """Trains ``model`` with ``optimizer`` on (X, y): binary, multi-class or regression (see Task).

    ``loss_fn`` (None: mse, or cross-entropy for multi-class) is read at every batch, so it
    can be changed at any time; each loss function gets its own compiled step.

    ``distributed=True`` (after ``mlir_nn.distributed.init()``, under ``mpiexec``): every
    rank starts from rank 0's parameters and shuffles like rank 0, then trains on its share
    of each batch with gradients averaged over the ranks; losses, accuracies and the
    parameters are those of a single process training on the whole batches. Only rank 0
    shows the progress bar.

    With ``backend="cuda"`` the parameters and optimizer state stay on the device while
    ``train`` runs (``mlir_nn.runtime.residency``): they are uploaded by the first step and written
    back into ``p.data`` when ``train`` returns or raises; validation reads them from the
    device step. Between ``train`` calls ``p.data`` is current and is what the next call
    starts from, so writing into it, ``load_state_dict`` and ``mlir_nn.load`` need nothing
    more. Host backends compute in ``p.data`` itself.
    """

    def __init__(self, model: Module, optimizer: Optimizer,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
                 backend: str | None = None, optimize: bool = True, distributed: bool = False) -> None:
        if distributed:  # data parallel over MPI: see mlir_nn.distributed.sharding
            from mlir_nn.distributed.sharding import prepare

            optimizer = prepare(model, optimizer)
        self.distributed = distributed
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.optimize = optimize
        self.losses: list[float] = []
        self.accuracies: list[float | None] = []
        self.val_losses: list[float] = []
        self.val_accuracies: list[float | None] = []
        self._forward = JitFunction(self._predict_step, backend=backend, optimize=optimize)
        self.backend = self._forward.backend
        self._steps: dict[Callable, Callable] = {}

    @property
    def dtype(self) -> str:
        return self.model.parameters()[0].dtype

    def _predict_step(self, x: Tensor) -> Tensor:
        return self.model(x)

    def _step_for(self, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> Callable:
        if loss_fn not in self._steps:
            step = train_step(self.model, self.optimizer, loss_fn, return_prediction=True)
            compiled = JitFunction(step, backend=self.backend, optimize=self.optimize)
            if self.distributed:
                from mlir_nn.distributed.sharding import ShardedStep

                compiled = ShardedStep(compiled)
            self._steps[loss_fn] = compiled
        return self._steps[loss_fn]

    def predict(self, X: Any) -> np.ndarray:
        """Model outputs for X, through the same backend as training."""
        return self._forward(np.asarray(X, dtype=self.dtype))

    def _evaluate(self, X: np.ndarray, y: np.ndarray, task: Task,
                  loss_fn: Callable[[Tensor, Tensor], Tensor]) -> tuple[float, float | None]:
        """(loss, accuracy) of the model on held-out data: one forward pass, the loss eagerly."""
        pred = self.predict(X)
        loss = float(loss_fn(Tensor(pred), Tensor(task.targets(y))).data)
        return loss, None if task.kind == "regression" else task.correct(pred, y) / len(X)

    def _epoch(self, X: np.ndarray, y: np.ndarray, targets: np.ndarray, task: Task,
               batch_size: int) -> tuple[float, float | None, Callable[[Tensor, Tensor], Tensor]]:
        """One pass over shuffled mini-batches: (mean loss, accuracy, the last loss function)."""
        total_loss, correct = 0.0, 0
        indices = list(range(len(X)))
        random.shuffle(indices)
        for start in range(0, len(X), batch_size):
            batch = indices[start:start + batch_size]
            loss_fn = self.loss_fn or task.default_loss()  # read at every batch, as tinynn's Trainer
            loss, pred = self._step_for(loss_fn)(X[batch], targets[batch])
            total_loss += float(loss) * len(batch)
            correct += task.correct(pred, y[batch])
        return total_loss / len(X), None if task.kind == "regression" else correct / len(X), loss_fn

    def train(self, X: Any, y: Any, n_epochs: int = 100, batch_size: int = 32, verbose: bool = True,
              early_stopping: bool = True, validation_data: tuple[Any, Any] | None = None,
              patience: int = 10) -> dict[str, list]:
        """Mini-batch training; returns {"losses": [...], "accuracies": [...]} per epoch (and
        "val_losses", "val_accuracies" with ``validation_data=(X_val, y_val)``).

        Early stopping: with validation data, when the validation loss has not improved for
        ``patience`` epochs; without, at 100% training accuracy and loss < 0.01 (tinynn).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size <= 0:
            raise ValueError(f"Trainer.train: batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(n_epochs, bool) or not isinstance(n_epochs, numbers.Integral) or n_epochs < 0:
            raise ValueError(f"Trainer.train: n_epochs must be an integer >= 0, got {n_epochs!r}")
        batch_size, n_epochs = int(batch_size), int(n_epochs)
        X, y = _as_arrays(X, y, self.dtype, "")
        outputs = self.model(Tensor(X[:1]))  # eager, one row: the output width, and a check of X's width
        task = Task(y, int(outputs.shape[-1]))
        targets = task.targets(y)
        val = None
        if validation_data is not None:
            val = _as_arrays(*validation_data, self.dtype, "validation")
            self.model(Tensor(val[0][:1]))  # X_val's width, checked before any step runs
            Task(val[1], task.outputs)  # the same checks as y
        if self.distributed:
            from mlir_nn.distributed import rank
            from mlir_nn.distributed.sharding import check_plan, sync_random_state

            check_plan(samples=len(X), X=X, y=y, n_epochs=n_epochs, batch_size=batch_size,
                       early_stopping=early_stopping, patience=patience,
                       X_val=None if val is None else val[0], y_val=None if val is None else val[1])
            sync_random_state()
            verbose = verbose and rank() == 0
        best, stale = float("inf"), 0
        if verbose:
            from tqdm import tqdm  # imported here: it takes longer to import than a cached step to load

            bar: Any = tqdm(total=n_epochs, desc="Training", unit="epoch")
        else:
            bar = _NoBar()  # quiet training needs no tqdm
        with residency.resident():  # device backends keep the state there until train() ends
            for epoch in range(n_epochs):
                avg_loss, accuracy, loss_fn = self._epoch(X, y, targets, task, batch_size)
                self.losses.append(avg_loss)
                self.accuracies.append(accuracy)
                shown = {"loss": f"{avg_loss:.4f}"} | ({} if accuracy is None else {"acc": f"{accuracy:.4f}"})
                if val is not None:
                    val_loss, val_accuracy = self._evaluate(*val, task, loss_fn)
                    self.val_losses.append(val_loss)
                    self.val_accuracies.append(val_accuracy)
                    shown["val_loss"] = f"{val_loss:.4f}"
                    if val_accuracy is not None:
                        shown["val_acc"] = f"{val_accuracy:.4f}"
                    best, stale = (val_loss, 0) if val_loss < best else (best, stale + 1)
                bar.set_postfix(shown, refresh=False)
                bar.update()
                if early_stopping and (stale >= patience if val is not None else accuracy == 1.0 and avg_loss < 0.01):
                    if verbose:
                        reason = f"no validation improvement in {patience} epochs" if val is not None \
                            else "100% accuracy"
                        bar.write(f"Early stopping at epoch {epoch + 1}: {reason}")
                    break
        bar.close()
        if verbose and self.losses:
            final = self.accuracies[-1]
            print("Training complete!")
            print(f"Final loss: {self.losses[-1]:.4f}")
            print(f"Final accuracy: {'n/a (regression)' if final is None else f'{final:.4f}'}")
        history: dict[str, list] = {"losses": self.losses, "accuracies": self.accuracies}
        if val is not None:
            history |= {"val_losses": self.val_losses, "val_accuracies": self.val_accuracies}
        return history

    def plot_training_progress(self, save_path: str = "output/training_progress.png") -> None:
        """Loss and accuracy per epoch, side by side (validation curves too when there are
        any; the loss alone for regression)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        classify = any(a is not None for a in self.accuracies)
        fig = Figure(figsize=(12, 5) if classify else (6, 5))
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 2) if classify else [fig.subplots()]
        curves = [(axes[0], "Loss", self.losses, self.val_losses)]
        if classify:
            curves.append((axes[1], "Accuracy", self.accuracies, self.val_accuracies))
        for ax, name, train, val in curves:
            ax.plot(train, label="training")
            if val:
                ax.plot(val, label="validation")
                ax.legend()
            ax.set(title=name if val else f"Training {name}", xlabel="Epoch", ylabel=name)
        fig.tight_layout()
        Path(save_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_path)

    def plot_decision_boundary(self, X: Any, y: Any, save_path: str = "output/decision_boundary.png",
                               resolution: int = 200) -> Any:
        """The model's sign over a grid around two-feature data, with the samples on top and a
        legend; returns the matplotlib Figure (also saved to ``save_path``)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D

        X, y = _check_data(X, y)
        if X.shape[1] != 2:
            raise ValueError(f"plot_decision_boundary: needs 2 input features, X has shape {X.shape}")
        pad = 0.5
        xs = np.linspace(X[:, 0].min() - pad, X[:, 0].max() + pad, resolution)
        ys = np.linspace(X[:, 1].min() - pad, X[:, 1].max() + pad, resolution)
        gx, gy = np.meshgrid(xs, ys)
        scores = self.predict(np.column_stack([gx.ravel(), gy.ravel()]))[:, 0].reshape(gx.shape)
        fig = Figure(figsize=(8, 6))
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        ax.contourf(gx, gy, scores > 0, alpha=0.3, cmap="RdBu")
        ax.contour(gx, gy, scores, levels=[0.0], colors="k", linewidths=1)
        points = ax.scatter(X[:, 0], X[:, 1], c=y, cmap="RdBu", edgecolors="k")
        handles, labels = points.legend_elements()
        boundary = Line2D([], [], color="k", linewidth=1)
        ax.legend([*handles, boundary], [f"class {label}" for label in labels] + ["decision boundary (output 0)"],
                  loc="best")
        ax.set(title="Neural Network Decision Boundary", xlabel="x1", ylabel="x2")
        Path(save_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_path)
        return fig
