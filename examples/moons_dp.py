"""The moons example, data parallel: ``mpiexec -n 2 .venv/bin/python examples/moons_dp.py``.

Every rank runs the same compiled step on its share of each mini-batch; the gradients are
averaged over the ranks inside the step (``DistributedOptimizer``), so every rank ends with
the parameters a single process would have. Rank 0 prints and writes the plots. Needs the
``dist`` extra: ``pip install -e '.[dist]'``.
"""

import argparse
import random
import time

import numpy as np
from sklearn.datasets import make_moons

from mlir_nn import distributed as dist
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import Trainer

parser = argparse.ArgumentParser(description="The moons MLP trained on all MPI ranks")
parser.add_argument("--epochs", type=int, default=500)
args = parser.parse_args()

dist.init()
random.seed(42)
np.random.seed(42)

X, y = make_moons(n_samples=100, noise=0.1, random_state=42)
model = MLP(nin=2, nouts=[32, 32, 16, 1])
optimizer = dist.DistributedOptimizer(SGD(model.parameters(), lr=0.005))
trainer = Trainer(model, optimizer, distributed=True)  # starts from rank 0's weights

start = time.perf_counter()
history = trainer.train(X, y, n_epochs=args.epochs, batch_size=10, verbose=dist.rank() == 0)
elapsed = time.perf_counter() - start

weights = dist.allgather(np.concatenate([p.data.ravel() for p in model.parameters()]))
spread = max(float(np.max(np.abs(w - weights[0]))) for w in weights)
if dist.rank() == 0:
    print(f"{dist.size()} ranks trained in {elapsed:.2f} s; largest parameter difference between ranks: {spread:.2g}")
    trainer.plot_training_progress("output/training_progress_dp.png")
    trainer.plot_decision_boundary(X, y, "output/decision_boundary_dp.png")
    print("Wrote output/training_progress_dp.png and output/decision_boundary_dp.png")
