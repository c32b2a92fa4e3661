"""Host-side cost of keeping CUDA state resident: the residency ledger's bookkeeping per step.

A resident CUDA step asks the ledger what to copy (``plan``), records it (``applied``)
and records its updates (``stepped``) on every call, inside ``stepping()`` (which holds
back Ctrl-C until the step is done); this times those calls, in
CPU seconds of this thread (``time.thread_time``, so other processes' load does not
count), for the parameter lists of real traced steps: the moons Trainer step (SGD with
momentum) and the 784-1024-1024-10 MLP with Adam. No GPU is involved: the copies the
ledger decides against are what the GPU check counts (``benchmarks/gpu_check.py``).

    python benchmarks/residency_overhead.py [--json FILE]

For a load-independent figure, count instructions at two step counts and divide the
difference (``valgrind --tool=callgrind``, or ``perf stat -e instructions:u`` where the
machine has the counters): ``python benchmarks/residency_overhead.py --workload moons
--steps N --rounds 1`` for two values of N.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlir_nn.jit import trace_step  # noqa: E402
from mlir_nn.losses import mse_loss  # noqa: E402
from mlir_nn.nn import MLP  # noqa: E402
from mlir_nn.optim import SGD, Adam  # noqa: E402
from mlir_nn.runtime.residency import Ledger, stepping  # noqa: E402
from mlir_nn.trainer import train_step  # noqa: E402

WORKLOADS = {"moons": ([2, 32, 32, 16, 1], 10, lambda ps: SGD(ps, lr=0.005, momentum=0.9)),
             "mlp-784-adam": ([784, 1024, 1024, 10], 512, lambda ps: Adam(ps, lr=1e-3))}


def step_state(sizes: list[int], batch: int, optimizer) -> tuple[list[np.ndarray], list[int], list[int]]:
    """(parameter arrays, updated slots, watched slots) of the traced training step."""
    np.random.seed(0)
    model = MLP(sizes[0], sizes[1:])
    x = np.zeros((batch, sizes[0]), np.float32)
    y = np.zeros((batch, sizes[-1]), np.float32)
    graph, captured, _ = trace_step(train_step(model, optimizer(model.parameters()), mse_loss), [x, y], ["x", "y"])
    names = [p.attr("name") for p in graph.params]
    updated = [names.index(name) for name, _ in graph.updates]
    arrays = [t.data for t in captured]
    watched = [i for i, a in enumerate(arrays) if a.ndim == 0 and i not in updated]
    return arrays, updated, watched


def per_step_seconds(arrays, updated, watched, steps: int = 2000, rounds: int = 7) -> float:
    """Median over rounds of the thread CPU time per resident step's bookkeeping."""
    ledger, holder = Ledger(), object()
    times = []
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(steps):
            with stepping():
                plan = ledger.plan(holder, arrays, True, watched)
                ledger.applied(plan)
                ledger.stepped(holder, arrays, updated, True, plan)
        times.append((time.thread_time() - start) / steps)
    assert ledger.transfers["uploads"] == len(arrays)  # uploaded by the first step only
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workload", choices=list(WORKLOADS), nargs="*", default=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    results = {}
    for name in args.workload:
        sizes, batch, optimizer = WORKLOADS[name]
        arrays, updated, watched = step_state(sizes, batch, optimizer)
        seconds = per_step_seconds(arrays, updated, watched, args.steps, args.rounds)
        results[name] = {"arrays": len(arrays), "updated": len(updated), "watched": len(watched),
                         "bookkeeping_us_per_step": round(seconds * 1e6, 2),
                         "bytes_not_copied_per_step": int(2 * sum(arrays[i].nbytes for i in updated))}
        print(f"{name}: {len(arrays)} arrays ({len(updated)} updated, {len(watched)} hyperparameters): "
              f"{seconds * 1e6:.1f} us of CPU per step for the ledger; a copying step moves "
              f"{results[name]['bytes_not_copied_per_step'] / 1e6:.2f} MB of parameters per step instead")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
