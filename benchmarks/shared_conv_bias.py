"""A convolution shared by two uses, one of which adds its bias and applies ReLU: is fusing the bias
(``conv2d_bias``, recomputing the convolution for that use) faster than computing the convolution
once and adding the bias and ReLU in a separate element-wise pass?

Each point's graph, ``relu(conv(x, w) + b)`` and ``conv(x, w) + 1.5``, is optimized twice: with the
e-graph's cost model (a convolution priced by its form, ``mlir_nn.ir.conv_forms``) and with a model
that prices a convolution like an element-wise op (as the e-graph did before). Both are compiled
for the CPU and timed on one thread (process CPU time per call), alternating in rounds; the table
gives each one's median and its convolution count.

    MLIR_NN_NUM_THREADS=1 python benchmarks/shared_conv_bias.py [--rounds 7] [--reps 20] [--smoke]

``--smoke`` times one tiny convolution once (the test suite's check that the script works).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlir_nn.backends.cpu import CpuBackend  # noqa: E402
from mlir_nn.egraph.cost import CostModel  # noqa: E402
from mlir_nn.egraph.driver import optimize  # noqa: E402
from mlir_nn.ir import Graph, conv_forms, make_node  # noqa: E402

# (label, batch, channels, image side, out channels, kernel, padding): LeNet-5's and VGG-small's convolutions
POINTS = [("lenet conv1 b64", 64, 1, 28, 6, 5, 2), ("lenet conv2 b64", 64, 6, 14, 16, 5, 0),
          ("vgg conv2 b128", 128, 32, 16, 64, 3, 1), ("vgg conv3 b128", 128, 64, 8, 128, 3, 1)]
SMOKE = [("tiny b2", 2, 2, 6, 3, 3, 1)]


@dataclass(frozen=True)
class ElementwiseConvCost(CostModel):
    """The e-graph's old price of a convolution: one FLOP per output element plus the bytes."""

    def node_cost(self, op: str, *args: object) -> float:  # type: ignore[override]
        return super().node_cost("elementwise" if op in conv_forms.CONV_OPS else op, *args)


def shared_conv_graph(batch: int, c: int, side: int, o: int, k: int, pad: int) -> Graph:
    def leaf(kind: str, name: str, shape: tuple) -> object:
        label = {"label": name} if kind == "param" else {}
        return make_node(kind, (), name=name, shape=shape, dtype="float32", **label)

    x, w, b = leaf("input", "x", (batch, c, side, side)), leaf("param", "w", (o, c, k, k)), leaf("param", "b", (o,))
    conv = make_node("conv2d", [x, w], stride=(1, 1), padding=(pad,) * 4, dilation=(1, 1), groups=1)
    biased = make_node("add", [conv, make_node("reshape", [b], shape=(o, 1, 1))])
    shifted = make_node("add", [conv, make_node("const", (), value=1.5, dtype="float32")])
    return Graph((x,), (w, b), (make_node("relu", [biased]), shifted), (), name=f"shared_conv_{c}_{side}_{o}_{k}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="one tiny convolution, timed once")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = args.reps = 1
    if os.environ.get("MLIR_NN_NUM_THREADS") != "1":
        raise SystemExit("run with MLIR_NN_NUM_THREADS=1 (one thread's CPU time)")
    rng = np.random.default_rng(0)
    for label, batch, *dims in SMOKE if args.smoke else POINTS:
        graph = shared_conv_graph(batch, *dims)
        arrays = [[rng.standard_normal(n.shape).astype(np.float32) for n in graph.inputs],
                  [rng.standard_normal(n.shape).astype(np.float32) for n in graph.params]]
        steps, convs = {}, {}
        models = {"form cost": CostModel(batch=batch), "element-wise cost": ElementwiseConvCost(batch=batch)}
        for name, model in models.items():
            optimized, _ = optimize(graph, batch, cost_model=model)
            convs[name] = sum(n.op.startswith("conv2d") for n in optimized.nodes)
            executable = CpuBackend().compile(optimized)
            steps[name] = lambda e=executable, a=arrays: e.run(*a)
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, run in steps.items():
                run()
                start = time.process_time()
                for _ in range(args.reps):
                    run()
                times[name].append((time.process_time() - start) / args.reps)
        print(label)
        for name, ts in times.items():
            print(f"  {name:18s} {convs[name]} conv  {statistics.median(ts) * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
