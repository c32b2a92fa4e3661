"""Median time of one cross-entropy training step of the digits MLP 64-64-32-10 with Adam.

Variants, measured round-robin (one short burst each per round, so load changes hit all
alike), reported as medians and as ratios to the fused compiled step:

* ``cpu``: the compiled CPU step as ``mlir_nn.jit`` builds it (the e-graph fuses the
  softmax cross-entropy gradient into one ``softmax_xent_grad`` kernel);
* ``cpu-unfused``: the same step optimized without the ``classification`` ruleset;
* ``numpy``: the reference interpreter of the optimized graph;
* ``torch``: PyTorch CPU eager (float32, same data), when importable.

    python benchmarks/classification_step.py [--batch 32] [--rounds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = [64, 64, 32, 10]


def batch_data(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.uniform(0, 1, (batch, SIZES[0])).astype(np.float32), rng.integers(0, 10, batch).astype(np.float32)


def mlir_nn_variants(x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], object]]:
    from mlir_nn.backends import get_backend
    from mlir_nn.egraph import RULESETS, optimize
    from mlir_nn.jit import trace_step
    from mlir_nn.losses import cross_entropy
    from mlir_nn.nn import MLP
    from mlir_nn.optim import Adam
    from mlir_nn.trainer import train_step

    np.random.seed(0)
    model = MLP(SIZES[0], SIZES[1:])
    step = train_step(model, Adam(model.parameters(), lr=1e-3), cross_entropy)
    graph, captured, _ = trace_step(step, [x, y], ["x", "y"])
    fused, _ = optimize(graph, batch_estimate=len(x))
    unfused, _ = optimize(graph, rulesets=[n for n in RULESETS if n != "classification"], batch_estimate=len(x))
    assert "softmax_xent_grad" in fused.op_counts() and "softmax_xent_grad" not in unfused.op_counts()
    variants = {}
    for name, g, backend in (("cpu", fused, "cpu"), ("cpu-unfused", unfused, "cpu"), ("numpy", fused, "numpy")):
        executable = get_backend(backend).compile(g)
        params = [np.array(t.data) for t in captured]  # private copies: each variant trains its own
        variants[name] = lambda e=executable, p=params: e.run([x, y], p)
    return variants


def torch_variant(x: np.ndarray, y: np.ndarray) -> Callable[[], object] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for i, (nin, nout) in enumerate(zip(SIZES, SIZES[1:])):
        layers += [torch.nn.Linear(nin, nout)] + ([torch.nn.ReLU()] if i < len(SIZES) - 2 else [])
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))

    def step() -> object:
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=50, help="steps per variant per round")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    x, y = batch_data(args.batch)
    variants = mlir_nn_variants(x, y)
    torch_step = torch_variant(x, y)
    if torch_step is not None:
        variants["torch"] = torch_step
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm up
    for _ in range(args.rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(args.reps):
                fn()
            times[name].append((time.perf_counter() - start) / args.reps)
    medians = {name: statistics.median(t) for name, t in times.items()}
    load = os.getloadavg()[0]
    print(f"digits MLP {'-'.join(map(str, SIZES))}, batch {args.batch}, Adam, cross-entropy; "
          f"{args.rounds} rounds x {args.reps} steps, load average {load:.2f}")
    for name, median in medians.items():
        print(f"  {name:12s} {median * 1e6:9.1f} us/step   {median / medians['cpu']:6.2f}x the fused cpu step")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"batch": args.batch, "load": load, "median_s": medians}, indent=2))


if __name__ == "__main__":
    main()
