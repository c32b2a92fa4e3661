"""E-graph optimizer time against model depth: deep narrow MLP steps, per stage.

For each depth (layers of width 16, batch 8, MSE) and optimizer, traces the training step
and runs the optimizer once (no disk cache), printing the traced nodes, the e-graph's
size, why saturation stopped and the seconds spent loading, saturating, extracting and
verifying. Time that grows linearly with depth shows as a steady ms-per-layer column.
Usage: python benchmarks/egraph_depth.py [--quick] [--depths 25,100,400] [--optimizers sgd,adam]
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compile_time import cpu_model  # noqa: E402
from mlir_nn.cli import build_parser, build_step  # noqa: E402
from mlir_nn.egraph.driver import optimize_here  # noqa: E402
from mlir_nn.jit import trace_step  # noqa: E402

WIDTH, BATCH = 16, 8


def traced_step(depth: int, optimizer: str):
    args = build_parser().parse_args(["compile", "--mlp", ",".join([str(WIDTH)] * (depth + 1)),
                                      "--batch", str(BATCH), "--optimizer", optimizer])
    step, x, y = build_step(args)
    return trace_step(step, [x, y], ["x", "y"])[0]


def main(depths: list[int], optimizers: list[str]) -> None:
    print(f"CPU: {cpu_model()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"width {WIDTH}, batch {BATCH}")
    print(f"{'optimizer':>9} {'depth':>5} {'nodes':>6} {'e-nodes':>8} {'stop':>12} {'load':>7} {'saturate':>8} "
          f"{'extract':>7} {'verify':>7} {'total s':>7} {'ms/layer':>8}")
    for optimizer in optimizers:
        for depth in depths:
            graph = traced_step(depth, optimizer)
            _, report = optimize_here(graph, batch_estimate=BATCH)
            if report.error:
                raise SystemExit(f"optimizer failed at depth {depth}: {report.error}")
            stage = report.stage_seconds
            print(f"{optimizer:>9} {depth:5d} {len(graph.nodes):6d} {report.egraph_nodes:8d} {report.stop_reason:>12} "
                  f"{stage['load']:7.2f} {stage['saturate']:8.2f} {stage['extract']:7.2f} {stage['verify']:7.2f} "
                  f"{report.seconds:7.2f} {report.seconds / depth * 1e3:8.1f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="depths 10 and 40, SGD only (a smoke run)")
    parser.add_argument("--depths", default="25,50,100,200,400", help="comma-separated depths")
    parser.add_argument("--optimizers", default="sgd,adam", help="comma-separated: sgd, adam")
    options = parser.parse_args()
    if options.quick:
        main([10, 40], ["sgd"])
    else:
        main([int(d) for d in options.depths.split(",")], options.optimizers.split(","))
