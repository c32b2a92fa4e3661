"""Handwritten digits (scikit-learn's 8x8 load_digits, shipped with it): an MLP 64-64-32-10
trained with cross-entropy and Adam, one compiled step per mini-batch.

Writes output/digits_training.png (loss and accuracy per epoch, training and validation)
and output/digits_confusion.png (the test set's confusion matrix).
"""

import argparse
import random
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import Trainer


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """counts[true class, predicted class]."""
    counts = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(counts, (labels, predicted), 1)
    return counts


def plot_confusion(counts: np.ndarray, accuracy: float, save_path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax)
    for (i, j), n in np.ndenumerate(counts):
        ax.text(j, i, str(n), ha="center", va="center", color="white" if n > counts.max() / 2 else "black")
    ticks = range(len(counts))
    ax.set(xticks=ticks, yticks=ticks, xlabel="Predicted digit", ylabel="True digit",
           title=f"Digits test set: accuracy {accuracy:.3f}")
    Path(save_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(save_path)


def main(n_epochs: int = 60, seed: int = 0, verbose: bool = True) -> float:
    random.seed(seed)
    np.random.seed(seed)
    digits = load_digits()
    X, y = digits.data / 16.0, digits.target  # pixels 0..16 -> 0..1
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, stratify=y, random_state=seed)
    X_fit, X_val, y_fit, y_val = train_test_split(X_train, y_train, test_size=0.1, stratify=y_train,
                                                  random_state=seed)

    model = MLP(64, [64, 32, 10])
    trainer = Trainer(model, Adam(model.parameters(), lr=3e-3))  # cross-entropy: chosen for class labels
    start = time.perf_counter()
    trainer.train(X_fit, y_fit, n_epochs=n_epochs, batch_size=32, verbose=verbose,
                  validation_data=(X_val, y_val), patience=8)
    elapsed = time.perf_counter() - start

    predicted = np.argmax(trainer.predict(X_test), axis=1)
    accuracy = float(np.mean(predicted == y_test))
    print(f"Trained {len(trainer.losses)} epochs in {elapsed:.2f} s on backend {trainer.backend!r}")
    print(f"Test accuracy: {accuracy:.4f} ({len(y_test)} held-out digits)")
    trainer.plot_training_progress("output/digits_training.png")
    plot_confusion(confusion_matrix(y_test, predicted, 10), accuracy, "output/digits_confusion.png")
    print("Wrote output/digits_training.png and output/digits_confusion.png")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("epochs", nargs="?", type=int, default=60, help="training epochs (default 60)")
    count = parser.parse_args().epochs
    if count < 1:
        parser.error(f"epochs must be a positive integer, got {count}")
    main(n_epochs=count)
