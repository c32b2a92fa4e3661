"""Run by tests/distributed/test_mpi.py under ``mpiexec -n 2``: one scenario per argument.

Prints ``OK <scenario>`` on success; any failure raises (non-zero exit).
"""

from __future__ import annotations

import os
import random
import sys
import time

import numpy as np

import mlir_nn
from mlir_nn import distributed as dist
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import Trainer, train_step

TOL = 1e-5


def make_optimizer(kind: str, params: list) -> object:
    return SGD(params, lr=0.05, momentum=0.9) if kind == "sgd" else Adam(params, lr=0.01)


def batches(steps: int, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1234)  # the same data on every rank
    return [(rng.standard_normal((batch, 3)).astype(np.float32), rng.standard_normal((batch, 2)).astype(np.float32))
            for _ in range(steps)]


def single_process_run(kind: str, data: list, backend: str) -> list[np.ndarray]:
    np.random.seed(0)
    model = MLP(3, [16, 2])
    step = mlir_nn.jit(train_step(model, make_optimizer(kind, model.parameters())), backend=backend)
    for x, y in data:
        step(x, y)
    return [p.data.copy() for p in model.parameters()]


def assert_close(what: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    worst = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    if worst > TOL:
        raise AssertionError(f"rank {dist.rank()}: {what}: max difference {worst:.3g} > {TOL}")


def acceptance(backend: str) -> None:
    """Each rank takes half of every batch; after several steps every rank's parameters equal
    a single-process run on the whole batches, and each other's."""
    for kind in ("sgd", "adam"):
        data = batches(5, 12)
        want = single_process_run(kind, data, backend)
        np.random.seed(dist.rank())  # differently seeded ranks; rank 0's seed is the single run's
        model = MLP(3, [16, 2])
        seeded = [p.data.copy() for p in model.parameters()]
        dist.broadcast_parameters(model.parameters())  # ...agree after the broadcast
        start = dist.allgather([p.data.copy() for p in model.parameters()])
        assert_close("parameters after the broadcast", start[1], start[0])
        if dist.rank() == 1 and all(np.array_equal(a, b) for a, b in zip(seeded, start[0])):
            raise AssertionError("rank 1 started from rank 0's weights: the seeds did not differ")
        opt = dist.DistributedOptimizer(make_optimizer(kind, model.parameters()))
        step = mlir_nn.jit(train_step(model, opt), backend=backend)
        half = slice(dist.rank() * 6, dist.rank() * 6 + 6)
        for x, y in data:
            step(x[half], y[half])
        got = [p.data.copy() for p in model.parameters()]
        assert_close(f"{kind}: distributed vs single process", got, want)
        everyone = dist.allgather(got)
        assert_close(f"{kind}: rank 1 vs rank 0", everyone[1], everyone[0])
        text = step.lower(*data[0]).as_text("optimized")
        if text.count("allreduce_mean") != len(model.parameters()):
            raise AssertionError(f"expected one allreduce_mean per parameter in the optimized step:\n{text}")


def trainer() -> None:
    """Trainer(distributed=True) equals a single-process Trainer: losses, accuracies, parameters
    (36 samples in batches of 7: shares of 4/3, and a last batch of one sample that leaves
    rank 1 with nothing to learn from)."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((36, 2))
    y = (X[:, 0] * X[:, 1] > 0).astype(float)

    def run(distributed: bool) -> tuple[dict, list[np.ndarray]]:
        random.seed(5)
        np.random.seed(5)
        model = MLP(2, [8, 1])
        t = Trainer(model, SGD(model.parameters(), lr=0.05, momentum=0.5), distributed=distributed)
        history = t.train(X, y, n_epochs=4, batch_size=7, verbose=False, early_stopping=False)
        return history, [p.data.copy() for p in model.parameters()]

    single, single_params = run(False)
    random.seed(dist.rank())  # the distributed trainer must not depend on each rank's seed
    distributed, params = run(True)
    assert_close("trainer parameters", params, single_params)
    np.testing.assert_allclose(distributed["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_array_equal(distributed["accuracies"], single["accuracies"])


def mismatch() -> None:
    """Ranks with different models: broadcast_parameters refuses, and their traced steps
    differ, which fails at the first step, naming the rank."""
    model = MLP(3, [4 + dist.rank(), 2])
    try:
        dist.broadcast_parameters(model.parameters())
    except dist.DistributedError as e:
        assert "ranks [1] hold parameters of other shapes" in str(e), e
    else:
        raise AssertionError("broadcast_parameters accepted parameters of different shapes")
    opt = dist.DistributedOptimizer(SGD(model.parameters(), lr=0.1))
    step = mlir_nn.jit(train_step(model, opt), backend="numpy", optimize=False)
    x, y = batches(1, 4)[0]
    try:
        step(x, y)
    except dist.DistributedError as e:
        print(f"rank {dist.rank()}: {e}", file=sys.stderr)
        raise SystemExit(3) from None
    raise AssertionError("different steps on the ranks were not detected")


def uneven() -> None:
    """Ranks holding different data (40 and 41 samples, or the same count but other values):
    every rank refuses at the start of train, naming what differs, before any collective step."""
    rng = np.random.default_rng(3)
    for counts_differ, X in ((True, rng.standard_normal((40 + dist.rank(), 2))),
                             (False, rng.standard_normal((40, 2)) + dist.rank())):
        y = (X[:, 0] > 0).astype(float)
        model = MLP(2, [4, 1])
        trainer = Trainer(model, SGD(model.parameters(), lr=0.1), backend="numpy", distributed=True)
        before = [p.data.copy() for p in model.parameters()]
        try:
            trainer.train(X, y, n_epochs=2, batch_size=8, verbose=False)
        except ValueError as e:
            assert "the ranks' training plans differ" in str(e), e
            assert ("samples: rank 0 40, rank 1 41" in str(e)) == counts_differ and "X: rank 0" in str(e), e
        else:
            raise AssertionError("ranks with different data trained")
        assert trainer.losses == [] and all(np.array_equal(a, p.data) for a, p in zip(before, model.parameters()))


def stuck(how: str, report: str) -> None:
    """Rank 1 never reaches the allreduce (it hangs, dies or raises); rank 0 must fail, not
    hang. Rank 0 writes its error to ``report`` (the job's abort may cut forwarded output).
    A rank that raises aborts the job at once: rank 0 keeps the 60 s timeout there."""
    if how != "raises":
        dist.init(timeout=3.0)
    model = MLP(3, [4, 2])
    opt = dist.DistributedOptimizer(SGD(model.parameters(), lr=0.1))
    step = mlir_nn.jit(train_step(model, opt), backend="numpy", optimize=False)
    x, y = batches(1, 4)[0]
    step(x, y)  # both ranks take part once
    if dist.rank() == 1:
        if how == "dies":
            os._exit(9)
        if how == "raises":
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(600)
    try:
        step(x, y)
    except dist.DistributedTimeout as e:
        with open(report, "w") as f:
            f.write(str(e))
        raise
    raise AssertionError("rank 0 finished a step without rank 1")


def main() -> None:
    dist.init(timeout=60.0)
    if dist.size() != 2:
        raise SystemExit(f"run me with mpiexec -n 2 (size is {dist.size()})")
    scenario = sys.argv[1]
    if scenario == "acceptance":
        acceptance(sys.argv[2])
        trainer()
    elif scenario == "mismatch":
        mismatch()
    elif scenario == "uneven":
        uneven()
    elif scenario in ("hangs", "dies", "raises"):
        stuck(scenario, sys.argv[2])
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print(f"OK {scenario} rank {dist.rank()}", flush=True)


if __name__ == "__main__":
    main()
