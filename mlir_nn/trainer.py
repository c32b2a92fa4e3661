"""Trainer: tinynn's training loop, one compiled step per mini-batch."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.jit import JitFunction
from mlir_nn.losses import mse_loss
from mlir_nn.nn import Module
from mlir_nn.optim import Optimizer


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


def _check_data(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    try:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"Trainer.train: X and y must be numeric arrays: {e}") from None
    if X.ndim == 1:
        X = X.reshape(-1, 1)
    if X.ndim != 2:
        raise ValueError(f"Trainer.train: X must have shape (samples, features), got {X.shape}")
    if len(X) == 0:
        raise ValueError(f"Trainer.train: X is empty (shape {X.shape})")
    if len(y) != len(X):
        raise ValueError(f"Trainer.train: len(X) = {len(X)} but len(y) = {len(y)}; expected one label per sample")
    for name, arr in (("X", X), ("y", y)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"Trainer.train: {name} contains NaN or infinite values; refusing to train on them")
    return X, y


class Trainer:
    """Trains ``model`` with ``optimizer`` on (X, y).

    Binary labels {0, 1} become targets -1 / +1 and a sample counts as class 1 when the
    model's output is > 0, as in tinynn. Other labels are used as regression targets
    (accuracy is then NaN).

    ``distributed=True`` (after ``mlir_nn.distributed.init()``, under ``mpiexec``): every
    rank starts from rank 0's parameters and shuffles like rank 0, then trains on its share
    of each batch with gradients averaged over the ranks; losses, accuracies and the
    parameters are those of a single process training on the whole batches.
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
        self.loss_fn = loss_fn or mse_loss
        self.losses: list[float] = []
        self.accuracies: list[float] = []
        self._step = JitFunction(train_step(model, optimizer, self.loss_fn, return_prediction=True),
                                 backend=backend, optimize=optimize)
        self._forward = JitFunction(self._predict_step, backend=backend, optimize=optimize)
        self.backend = self._step.backend
        if distributed:
            from mlir_nn.distributed.sharding import ShardedStep

            self._step = ShardedStep(self._step)

    @property
    def dtype(self) -> str:
        return self.model.parameters()[0].dtype

    def _predict_step(self, x: Tensor) -> Tensor:
        return self.model(x)

    def predict(self, X: Any) -> np.ndarray:
        """Model outputs for X, through the same backend as training."""
        return self._forward(np.asarray(X, dtype=self.dtype))

    def train(self, X: Any, y: Any, n_epochs: int = 100, batch_size: int = 32, verbose: bool = True,
              early_stopping: bool = True) -> dict[str, list[float]]:
        """Run mini-batch training; returns {"losses": [...], "accuracies": [...]} per epoch."""
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"Trainer.train: batch_size must be a positive integer, got {batch_size!r}")
        if n_epochs < 0:
            raise ValueError(f"Trainer.train: n_epochs must be >= 0, got {n_epochs}")
        X, y = _check_data(X, y)
        binary = bool(np.isin(np.unique(y), (0.0, 1.0)).all())
        targets = np.where(y == 1, 1.0, -1.0) if binary else y
        targets = targets.reshape(len(targets), -1).astype(self.dtype)
        X = X.astype(self.dtype)
        if self.distributed:
            from mlir_nn.distributed.sharding import sync_random_state

            sync_random_state()
        if verbose:
            print("Training neural network...")
        for epoch in range(n_epochs):
            total_loss, correct = 0.0, 0
            indices = list(range(len(X)))
            random.shuffle(indices)
            for start in range(0, len(X), batch_size):
                batch = indices[start:start + batch_size]
                loss, pred = self._step(X[batch], targets[batch])
                total_loss += float(loss)
                if binary:
                    correct += int(np.sum((pred[:, 0] > 0) == (y[batch] == 1)))
            avg_loss = total_loss / max(1, len(X) // batch_size)
            accuracy = correct / len(X) if binary else float("nan")
            self.losses.append(avg_loss)
            self.accuracies.append(accuracy)
            if verbose and (epoch + 1) % 10 == 0:
                print(f"Epoch {epoch + 1}/{n_epochs}: Loss={avg_loss:.4f}, Accuracy={accuracy:.4f}")
            if early_stopping and accuracy == 1.0 and avg_loss < 0.01:
                if verbose:
                    print(f"Early stopping at epoch {epoch + 1} with 100% accuracy!")
                break
        if verbose and self.accuracies:
            print("Training complete!")
            print(f"Final accuracy: {self.accuracies[-1]:.4f}")
        return {"losses": self.losses, "accuracies": self.accuracies}

    def plot_training_progress(self, save_path: str = "output/training_progress.png") -> None:
        """Loss and accuracy per epoch, side by side."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(12, 5))
        FigureCanvasAgg(fig)
        ax_loss, ax_acc = fig.subplots(1, 2)
        ax_loss.plot(self.losses)
        ax_loss.set(title="Training Loss", xlabel="Epoch", ylabel="Loss")
        ax_acc.plot(self.accuracies)
        ax_acc.set(title="Training Accuracy", xlabel="Epoch", ylabel="Accuracy")
        fig.tight_layout()
        Path(save_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_path)

    def plot_decision_boundary(self, X: Any, y: Any, save_path: str = "output/decision_boundary.png",
                               resolution: int = 200) -> None:
        """The model's sign over a grid around two-feature data, with the samples on top."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

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
        ax.scatter(X[:, 0], X[:, 1], c=y, cmap="RdBu", edgecolors="k")
        ax.set(title="Neural Network Decision Boundary", xlabel="x1", ylabel="x2")
        Path(save_path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_path)
