"""Data-parallel throughput: the large step (MLP 784-1024-1024-10, global batch 512) on 1 and 2 ranks.

Each configuration runs under ``mpiexec`` in fresh processes, in interleaved rounds
(1 rank, 2 ranks, 1 rank, ...) so that a change in the machine's load hits both alike:

* ``1 rank, plain``: the compiled step with a plain SGD, no MPI in the step (the baseline);
* ``1 rank, dp``: the same through ``DistributedOptimizer`` (split step, reduction over one rank);
* ``2 ranks, dp``: each rank computes half of every batch (256 samples), pinned to its own core.

Reported: samples/s (global batch / step time, median over rounds), scaling efficiency
(2-rank throughput / (2 x 1-rank plain throughput)), and the time per step spent in the
allreduce (including waiting for the slower rank). Needs the ``dist`` extra.

    python benchmarks/data_parallel.py [--rounds 3] [--steps 20] [--json benchmarks/results/data_parallel.json]

``--sizes 2,8,1 --batch 8`` runs another MLP (the test suite's smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = [784, 1024, 1024, 10]
BATCH = 512
LR = 0.005


def worker(mode: str, steps: int, sizes: list[int], batch: int) -> None:
    """One configuration under mpiexec: rank 0 prints one JSON line of timings."""
    sys.path.insert(0, str(ROOT))
    import mlir_nn
    from benchmarks.step_time import init_weights
    from mlir_nn import distributed as dist
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    dist.init(timeout=600.0)
    model = MLP(sizes[0], sizes[1:])
    for p, w in zip(model.parameters(), init_weights(sizes)):  # step_time.py's weights: training stays finite
        p.data[...] = w
    dist.broadcast_parameters(model.parameters())
    opt = SGD(model.parameters(), lr=LR)
    if mode == "dp":
        opt = dist.DistributedOptimizer(opt)
    step = mlir_nn.jit(train_step(model, opt))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    share = batch // dist.size()
    lo = dist.rank() * share
    xs, ys = np.ascontiguousarray(x[lo:lo + share]), np.ascontiguousarray(y[lo:lo + share])
    step(xs, ys)  # trace, compile (or load from the disk cache), warm up
    executable = step.lower(xs, ys).executable
    reduced_before = getattr(executable, "allreduce_seconds", 0.0)
    dist.allgather(None)  # start together
    start = time.perf_counter()
    for _ in range(steps):
        step(xs, ys)
    elapsed = time.perf_counter() - start
    allreduce = getattr(executable, "allreduce_seconds", 0.0) - reduced_before
    times = dist.allgather((elapsed, allreduce))
    if dist.rank() == 0:
        slowest = max(t for t, _ in times)
        print(json.dumps({"step_s": slowest / steps, "allreduce_s": max(a for _, a in times) / steps}))


def run_config(ranks: int, mode: str, steps: int, sizes: list[int], batch: int) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    bind = ["-bind-to", "core"] if ranks > 1 else []
    command = [str(mpiexec), "-n", str(ranks), *bind, sys.executable, __file__, "--worker", mode,
               "--steps", str(steps), "--sizes", ",".join(map(str, sizes)), "--batch", str(batch)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "data_parallel.json"))
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="the MLP's layer widths")
    parser.add_argument("--batch", type=int, default=BATCH, help="global batch (even: two ranks share it)")
    parser.add_argument("--worker", choices=["plain", "dp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes, batch = [int(w) for w in args.sizes.split(",")], args.batch
    if args.worker:
        worker(args.worker, args.steps, sizes, batch)
        return
    configs = {"1 rank, plain": (1, "plain"), "1 rank, dp": (1, "dp"), "2 ranks, dp": (2, "dp")}
    samples: dict[str, list[dict]] = {name: [] for name in configs}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, (ranks, mode) in configs.items():
            samples[name].append(run_config(ranks, mode, args.steps, sizes, batch))
            load.append(os.getloadavg()[0])
    rows = {}
    for name, runs in samples.items():
        step = statistics.median(r["step_s"] for r in runs)
        rows[name] = {"step_s": step, "samples_per_s": batch / step,
                      "allreduce_s": statistics.median(r["allreduce_s"] for r in runs),
                      "all_step_s": [r["step_s"] for r in runs]}
    base = rows["1 rank, plain"]["samples_per_s"]
    results = {"sizes": sizes, "global_batch": batch, "steps": args.steps, "rounds": args.rounds,
               "cpus": os.cpu_count(), "load_1min": load, "configs": rows,
               "scaling_efficiency": rows["2 ranks, dp"]["samples_per_s"] / (2 * base)}
    print(f"MLP {'-'.join(map(str, sizes))}, global batch {batch}, {args.steps} steps x {args.rounds} rounds, "
          f"{os.cpu_count()} cpus, 1-min load {min(load):.1f}..{max(load):.1f}")
    print(f"  {'configuration':16s} {'step':>10s} {'samples/s':>10s} {'allreduce/step':>15s}")
    for name, row in rows.items():
        print(f"  {name:16s} {row['step_s'] * 1e3:7.1f} ms {row['samples_per_s']:10.0f} "
              f"{row['allreduce_s'] * 1e3:12.2f} ms")
    print(f"scaling efficiency of 2 ranks: {results['scaling_efficiency']:.2f} "
          f"(2-rank samples/s over twice the 1-rank plain samples/s)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
