"""The seed's end-to-end example: an MLP learns the two moons, one compiled step per batch."""

import argparse
import random
import time

import numpy as np
from sklearn.datasets import make_moons

from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import Trainer

argparse.ArgumentParser(description=__doc__).parse_args()  # --help; it takes no arguments
random.seed(42)
np.random.seed(42)

# Generate the dataset
X, y = make_moons(n_samples=100, noise=0.1, random_state=42)

# Create a neural network: 2 inputs -> 32 -> 32 -> 16 -> 1 output
model = MLP(nin=2, nouts=[32, 32, 16, 1])

# Create an optimizer
optimizer = SGD(model.parameters(), lr=0.005)

# Create trainer
trainer = Trainer(model, optimizer)

# Train the model
start = time.perf_counter()
history = trainer.train(X, y, n_epochs=500, batch_size=10, verbose=True)
elapsed = time.perf_counter() - start
print(f"Training took {elapsed:.2f} s on backend {trainer.backend!r}")

trainer.plot_training_progress("output/training_progress.png")
trainer.plot_decision_boundary(X, y, "output/decision_boundary.png")
print("Wrote output/training_progress.png and output/decision_boundary.png")
