"""Handwritten digits (scikit-learn's 8x8 load_digits) with a LeNet-style CNN: two 3x3
convolutions with ReLU, 2x2 max pooling, then two fully connected layers, trained with
cross-entropy and Adam, one compiled step per mini-batch.

Writes output/digits_cnn_training.png (loss and accuracy per epoch, training and validation),
output/digits_cnn_confusion.png (the test set's confusion matrix) and
output/digits_cnn_filters.png (the first layer's learned 3x3 filters).

    python examples/digits_cnn.py [EPOCHS]
"""

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.optim import Adam
from mlir_nn.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits import confusion_matrix, plot_confusion  # noqa: E402  (the MLP example's helpers)


class DigitsCnn(nn.Module):
    """(N, 64) pixels -> (N, 1, 8, 8) -> conv 32 -> conv 64 -> 2x2 max pool -> 1024 -> 128 -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                                      nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x.reshape(x.shape[0], 1, 8, 8)))


def shifted_copies(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The images and their copies moved by one pixel up, down, left and right (zeros shifted in)."""
    images = X.reshape(-1, 8, 8)
    copies = [images]
    for axis in (1, 2):
        for step in (-1, 1):
            moved = np.roll(images, step, axis=axis)
            edge = [slice(None)] * 3
            edge[axis] = 0 if step == 1 else -1
            moved[tuple(edge)] = 0.0
            copies.append(moved)
    return np.concatenate(copies).reshape(-1, 64), np.tile(y, len(copies))


def plot_filters(weight: np.ndarray, save_path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 2.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(weight) // 2)
    for ax, w in zip(axes.flat, weight[:, 0]):
        ax.imshow(w, cmap="RdBu_r", vmin=-np.abs(weight).max(), vmax=np.abs(weight).max())
        ax.set(xticks=[], yticks=[])
    fig.suptitle("First convolution's 3x3 filters")
    Path(save_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(save_path)


def main(n_epochs: int = 20, seed: int = 0, verbose: bool = True) -> float:
    random.seed(seed)
    np.random.seed(seed)
    digits = load_digits()
    X, y = digits.data / 16.0, digits.target  # pixels 0..16 -> 0..1
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, stratify=y, random_state=seed)
    X_fit, X_val, y_fit, y_val = train_test_split(X_train, y_train, test_size=0.1, stratify=y_train,
                                                  random_state=seed)

    X_fit, y_fit = shifted_copies(X_fit, y_fit)  # a little augmentation: 5x the training images
    model = DigitsCnn()
    trainer = Trainer(model, Adam(model.parameters(), lr=1e-3))  # cross-entropy: chosen for class labels
    start = time.perf_counter()
    trainer.train(X_fit, y_fit, n_epochs=n_epochs, batch_size=32, verbose=verbose,
                  validation_data=(X_val, y_val), patience=4)
    elapsed = time.perf_counter() - start

    predicted = np.argmax(trainer.predict(X_test), axis=1)
    accuracy = float(np.mean(predicted == y_test))
    print(f"Trained {len(trainer.losses)} epochs in {elapsed:.2f} s on backend {trainer.backend!r}")
    print(f"Test accuracy: {accuracy:.4f} ({len(y_test)} held-out digits)")
    trainer.plot_training_progress("output/digits_cnn_training.png")
    plot_confusion(confusion_matrix(y_test, predicted, 10), accuracy, "output/digits_cnn_confusion.png")
    plot_filters(model.features[0].weight.data, "output/digits_cnn_filters.png")
    print("Wrote output/digits_cnn_training.png, output/digits_cnn_confusion.png and output/digits_cnn_filters.png")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("epochs", nargs="?", type=int, default=20, help="training epochs (default 20)")
    count = parser.parse_args().epochs
    if count < 1:
        parser.error(f"epochs must be a positive integer, got {count}")
    main(n_epochs=count)
