"""Optimizer figures for the moons step (MLP 2-32-32-16-1, batch 100, MSE, SGD lr 0.005).

Prints node counts, estimated cost and rules applied before/after, and the median time
of several ``optimize`` runs (the target is under 0.5 s). Writes nothing.
Usage: python benchmarks/egraph_moons.py [runs]
"""

import argparse
import statistics
import time

from mlir_nn.cli import build_parser, build_step
from mlir_nn.egraph import optimize
from mlir_nn.jit import trace_step


def main(runs: int = 9) -> None:
    args = build_parser().parse_args(["compile", "--mlp", "2,32,32,16,1", "--batch", "100", "--lr", "0.005"])
    step, x, y = build_step(args)
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        optimized, report = optimize(graph, batch_estimate=100)
        times.append(time.perf_counter() - start)
    print(report)
    print(f"op counts before: {dict(sorted(graph.op_counts().items()))}")
    print(f"op counts after:  {dict(sorted(optimized.op_counts().items()))}")
    median = statistics.median(times)
    print(f"optimize time: median {median * 1e3:.1f} ms over {runs} runs "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}); target < 500 ms: {median / 0.5:.2f}x of budget")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=9, help="optimize runs to take the median of (default 9)")
    main(parser.parse_args().runs)
