"""A grid of training steps over the shape space: the compiled CPU step against PyTorch, JAX and NumPy.

Each point is (MLP sizes, batch, optimizer, dtype): narrow layers at large batch, mid widths,
wide layers at small batch, deep stacks, SGD and Adam, float32 and float64. Every point runs
the same step (forward, MSE loss, backward, update) from the same weights in four ways:
the compiled CPU step (``mlir_nn.jit``), PyTorch CPU, JAX jit and a hand-written NumPy step.
Before timing, their first losses are compared (the same work is timed). The contenders
then run round-robin, a slice each per round with a pause before each turn (OpenBLAS's
spinning threads), and the median of the rounds' medians is reported, so load that comes
and goes hits them alike. Per point: ours / the best of PyTorch and JAX (the goal: <= 1.0),
ours / NumPy, GFLOP/s and the fraction of the FMA peak (a loop of independent vector FMAs on
every thread, halved for float64, run round-robin with the point's contenders: the median peak
the host gave while the point ran, printed beside it; the JSON also has the fraction of the best
of a longer run at the start), and the one-way time of a cache line between two cores before
and after the point (``core_latency``: on a virtual machine whose host moves
its cores between core complexes, over 80 ns means no shared L3 and slower threaded steps);
over the grid: geomean and worst ratio, and the points over 1.0 by placement (near, far, mixed).
"threads" says which team width ran our step (``task_runtime.c``, "Team width by measurement"):
the share of its timed calls on all threads, and the width in use at the end.
The CPU model (``lscpu``) and the load average before and after go into the JSON.

    python benchmarks/grid.py [--quick | --held-out | --smoke] [--only SUBSTRING] [--json benchmarks/results/grid.json]

``--smoke`` runs one tiny point once with tiny budgets (the test suite's check that the
script works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.core_latency import FAR_NS, one_way_ns  # noqa: E402
from benchmarks.step_time import flops_per_step, round_robin  # noqa: E402

LR = {"sgd": 0.005, "adam": 1e-3}
BETAS, EPS = (0.9, 0.999), 1e-8
PEERS = ("pytorch-cpu", "jax-jit")  # the goal: ours <= the best of these at every point
LOSS_RTOL = {"float32": 1e-3, "float64": 1e-9}  # first-step losses of all contenders agree this closely


# One burst of the FMA peak loop on every thread: ~9 ms at 180 GFLOP/s, so starting its thread costs
# about 1%; it runs round-robin with a point's contenders, so the fraction of the peak compares
# with the peak the host gave while the point ran (both swing with load, a step's more).
PEAK_LABEL, PEAK_BURST_ITERATIONS = "fma peak", 5_000_000


@dataclass(frozen=True)
class FmaPeak:
    """The FMA peak loop (``matmul_table.fma_burst``) as one burst of ``iterations`` per call, and the
    best of PEAK_TRIES longer runs at the start of the grid."""
    burst_of: Callable[[int], None]
    flops_per_iteration: float
    iterations: int
    at_start: float

    @classmethod
    def measure(cls, threads: int, iterations: int) -> FmaPeak:
        from benchmarks.matmul_table import fma_burst, fma_peak

        burst, flops = fma_burst(threads)
        return cls(burst, flops, iterations, fma_peak(threads, iterations=4 * iterations))

    def burst(self) -> None:
        self.burst_of(self.iterations)

    def gflops(self, seconds_per_burst: float) -> float:
        return self.iterations * self.flops_per_iteration / seconds_per_burst / 1e9


@dataclass(frozen=True)
class Point:
    sizes: tuple[int, ...]
    batch: int
    optimizer: str = "sgd"
    dtype: str = "float32"

    @property
    def label(self) -> str:
        return f"{'-'.join(map(str, self.sizes))} b{self.batch} {self.optimizer} {self.dtype}"


GRID = [
    Point((2, 32, 32, 16, 1), 10),  # the moons step
    Point((2, 32, 32, 16, 1), 1000),
    Point((2, 32, 32, 16, 1), 10000),
    Point((2, 32, 32, 16, 1), 10000, "adam"),
    Point((2, 32, 32, 16, 1), 10000, dtype="float64"),
    Point((1, 64, 1), 8192),  # width 1 in and out
    Point((8, 64, 64, 1), 16384),  # narrow layers at the largest batch
    Point((16, 64, 64, 64, 64, 64, 64, 64, 1), 4096),  # depth 8
    Point((64, 64, 32, 10), 1, "adam"),  # batch 1
    Point((64, 64, 32, 10), 256),
    Point((64, 64, 32, 10), 256, "adam"),
    Point((128, 512, 512, 512, 1), 256),
    Point((256, 256, 256, 10), 1024, dtype="float64"),
    Point((784, 256, 10), 1024),
    Point((784, 1024, 1024, 10), 512),  # the large step
    Point((1024, 4096, 1024), 16),  # wide layers at small batch
    Point((512, 4096, 10), 32, "adam"),
    Point((1000, 10), 10000),  # a few outputs over a long input: no packed copy of the batch
    Point((24, 48, 48, 24), 20000),  # rows of no power of two of vector registers
    Point((100, 100, 100, 100, 1), 5000, "adam"),  # widths that leave a short last column panel
]
QUICK = [GRID[i] for i in (0, 2, 4, 6, 9, 11, 13, 15)]
HELD_OUT = [  # points in none of the above, chosen before they were measured, to check that the grid was not fit
    Point((3, 100, 100, 1), 3000),  # narrow in and out, mid hidden width, odd batch
    Point((48, 200, 10), 777),
    Point((1000, 300, 300, 10), 64, "adam"),  # a long input at small batch
    Point((32,) * 9, 2048),  # depth 8, all 32 wide
    Point((2048, 2048, 10), 32),  # wide at small batch
    Point((5, 16, 1), 16384, dtype="float64"),  # narrow at the largest batch, float64
    Point((10, 4096, 1), 100),  # one very wide hidden layer
    Point((300, 150, 75, 2), 128, "adam", "float64"),
    Point((12, 3), 12000),  # depth 1, narrow
    Point((64, 256, 256, 64), 1),  # batch 1, SGD
    Point((40, 80, 160, 80, 40, 1), 1500, "adam"),
    Point((512, 512, 512), 333, dtype="float64"),
]
SMOKE = [Point((3, 5, 2), 7, "adam")]


def init_weights(point: Point, seed: int = 0) -> list[np.ndarray]:
    """[W0, b0, W1, b1, ...], W as (nin, nout), scaled like a fan-in init."""
    rng = np.random.default_rng(seed)
    params = []
    for nin, nout in zip(point.sizes, point.sizes[1:]):
        params += [(rng.standard_normal((nin, nout)) / np.sqrt(nin)).astype(point.dtype),
                   (0.1 * rng.standard_normal(nout)).astype(point.dtype)]
    return params


def data(point: Point) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.standard_normal((point.batch, point.sizes[0])).astype(point.dtype),
            rng.standard_normal((point.batch, point.sizes[-1])).astype(point.dtype))


def mlir_nn_step(point: Point) -> Callable[[np.ndarray, np.ndarray], float]:
    from mlir_nn import jit
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD, Adam
    from mlir_nn.trainer import train_step

    model = MLP(point.sizes[0], list(point.sizes[1:]), dtype=point.dtype)
    for p, w in zip(model.parameters(), init_weights(point)):
        p.data[...] = w
    lr = LR[point.optimizer]
    opt = SGD(model.parameters(), lr=lr) if point.optimizer == "sgd" else Adam(
        model.parameters(), lr=lr, betas=BETAS, eps=EPS)
    step = jit(train_step(model, opt), backend="cpu", tiered=False)  # compiled at the first call

    def run(x: np.ndarray, y: np.ndarray) -> float:
        return float(step(x, y))

    def team_choice(x: np.ndarray, y: np.ndarray) -> dict | None:
        """What the runtime measured of the step's team width at this batch (None: not threaded)."""
        executable = step.lower(x, y).executable
        return executable.team_choice(len(x)) if hasattr(executable, "team_choice") else None

    run.team_choice = team_choice
    return run


def numpy_step(point: Point) -> Callable[[np.ndarray, np.ndarray], float]:
    """The step written directly in NumPy (its BLAS for the products)."""
    params = init_weights(point)
    moments = [[np.zeros_like(p) for p in params] for _ in range(2)]
    n_layers, dtype, lr = len(point.sizes) - 1, np.dtype(point.dtype), LR[point.optimizer]
    t = [0]

    def update(grads: list[np.ndarray]) -> None:
        if point.optimizer == "sgd":
            for p, g in zip(params, grads):
                p -= dtype.type(lr) * g
            return
        t[0] += 1
        c1, c2 = 1 - BETAS[0] ** t[0], 1 - BETAS[1] ** t[0]
        for p, g, m, v in zip(params, grads, *moments):
            m *= dtype.type(BETAS[0])
            m += dtype.type(1 - BETAS[0]) * g
            v *= dtype.type(BETAS[1])
            v += dtype.type(1 - BETAS[1]) * (g * g)
            p -= dtype.type(lr / c1) * m / (np.sqrt(v / dtype.type(c2)) + dtype.type(EPS))

    def step(x: np.ndarray, y: np.ndarray) -> float:
        acts, h = [x], x
        for i in range(n_layers):
            h = h @ params[2 * i] + params[2 * i + 1]
            if i < n_layers - 1:
                h = np.maximum(h, 0)
            acts.append(h)
        diff = h - y
        loss = float(np.mean(diff * diff))
        g = diff * dtype.type(2.0 / diff.size)
        grads: list[np.ndarray] = [np.empty(0)] * len(params)
        for i in reversed(range(n_layers)):
            grads[2 * i], grads[2 * i + 1] = acts[i].T @ g, g.sum(axis=0)
            if i > 0:
                g = (g @ params[2 * i].T) * (acts[i] > 0)
        update(grads)
        return loss

    return step


def torch_step(point: Point) -> Callable[[np.ndarray, np.ndarray], float]:
    import torch

    weights = init_weights(point)
    layers: list = []
    for i, (nin, nout) in enumerate(zip(point.sizes, point.sizes[1:])):
        linear = torch.nn.Linear(nin, nout, dtype=getattr(torch, point.dtype))
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weights[2 * i].T.copy()))
            linear.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
        layers.append(linear)
        if i < len(point.sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    lr = LR[point.optimizer]
    opt = torch.optim.SGD(model.parameters(), lr=lr) if point.optimizer == "sgd" else torch.optim.Adam(
        model.parameters(), lr=lr, betas=BETAS, eps=EPS)

    def step(x: np.ndarray, y: np.ndarray) -> float:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return loss.item()

    return step


def jax_step(point: Point) -> Callable[[np.ndarray, np.ndarray], float]:
    import jax
    import jax.numpy as jnp

    n_layers, lr = len(point.sizes) - 1, LR[point.optimizer]

    def loss_fn(ps, x, y):
        h = x
        for i in range(n_layers):
            h = h @ ps[2 * i] + ps[2 * i + 1]
            if i < n_layers - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def sgd(state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(state["ps"], x, y)
        return {"ps": [p - lr * g for p, g in zip(state["ps"], grads)]}, loss

    @jax.jit
    def adam(state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(state["ps"], x, y)
        t = state["t"] + 1
        c1, c2 = 1 - BETAS[0] ** t, 1 - BETAS[1] ** t
        m = [BETAS[0] * m + (1 - BETAS[0]) * g for m, g in zip(state["m"], grads)]
        v = [BETAS[1] * v + (1 - BETAS[1]) * g * g for v, g in zip(state["v"], grads)]
        ps = [p - (lr / c1) * mi / (jnp.sqrt(vi / c2) + EPS) for p, mi, vi in zip(state["ps"], m, v)]
        return {"ps": ps, "m": m, "v": v, "t": t}, loss

    params = [jnp.asarray(p) for p in init_weights(point)]
    state: dict = {"ps": params}
    if point.optimizer == "adam":
        state.update(m=[jnp.zeros_like(p) for p in params], v=[jnp.zeros_like(p) for p in params],
                     t=jnp.asarray(0, point.dtype))
    update = sgd if point.optimizer == "sgd" else adam
    box = [state]

    def step(x: np.ndarray, y: np.ndarray) -> float:
        box[0], loss = update(box[0], x, y)
        return float(loss)

    return step


def contenders() -> dict[str, Callable[[Point], Callable] | str]:
    """Every contender's factory, or the reason a peer is skipped."""
    found: dict[str, Callable[[Point], Callable] | str] = {"compiled cpu": mlir_nn_step, "numpy": numpy_step}
    for name, module, factory in (("pytorch-cpu", "torch", torch_step), ("jax-jit", "jax", jax_step)):
        try:
            __import__(module)
            found[name] = factory
        except ImportError as error:
            found[name] = f"not installed ({error}); pip install '.[bench]'"
    if not isinstance(found["jax-jit"], str):
        import jax

        jax.config.update("jax_enable_x64", True)  # float64 points; float32 arrays stay float32
    return found


def check_same_work(point: Point, steps: dict[str, Callable]) -> dict[str, list[float]]:
    """The losses of every contender's first two steps (the second one after an update), which
    must agree with NumPy's: the same step is timed."""
    x, y = data(point)
    losses = {label: [step(x, y), step(x, y)] for label, step in steps.items()}
    for label, pair in losses.items():
        for loss, ref in zip(pair, losses["numpy"]):
            if not math.isclose(loss, ref, rel_tol=LOSS_RTOL[point.dtype], abs_tol=1e-12):
                raise RuntimeError(f"{point.label}: {label}'s losses {pair} differ from NumPy's {losses['numpy']}")
    return losses


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (lscpu failed)"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    keys = ("Model name", "CPU family", "Model", "CPU(s)", "Flags")
    info = {k: fields[k].strip() for k in keys if k in fields}
    flags = info.pop("Flags", "").split()
    isa = [f for f in ("avx2", "fma", "avx512f") if f in flags]
    return "; ".join(f"{k} {v}" for k, v in info.items()) + f"; {' '.join(isa)}"


def _width(choice: dict | None) -> str:
    """Which team width ran our step's calls (``task_runtime.team_choice``): the share of the timed
    calls on all threads, and the width in use at the end."""
    if not choice or not choice["calls_alone"] + choice["calls_all"]:
        return "-"
    share = choice["calls_all"] / (choice["calls_alone"] + choice["calls_all"])
    return f"all {share:.0%}, now {choice['using'] or '-'}"


def run_point(point: Point, factories: dict, budget_s: float, rounds: int, peak: FmaPeak) -> dict:
    steps = {label: factory(point) for label, factory in factories.items() if not isinstance(factory, str)}
    losses = check_same_work(point, steps)
    x, y = data(point)
    latency_before = one_way_ns()
    contenders = {label: (lambda s=step: s(x, y)) for label, step in steps.items()}
    timed = round_robin({**contenders, PEAK_LABEL: peak.burst}, budget_s, rounds)
    latency_after = one_way_ns()
    choice = steps["compiled cpu"].team_choice(x, y)
    peak_here = peak.gflops(timed.pop(PEAK_LABEL)["median_s"])
    medians = {label: row["median_s"] for label, row in timed.items()}
    ours = medians["compiled cpu"]
    peers = [medians[p] for p in PEERS if p in medians]
    flops = flops_per_step(list(point.sizes), point.batch)
    halved = 2 if point.dtype == "float64" else 1  # lanes of a vector register per float32 lane
    row = {"sizes": list(point.sizes), "batch": point.batch, "optimizer": point.optimizer, "dtype": point.dtype,
           "first_losses": losses, "median_s": medians,
           "round_medians_s": {k: v["round_medians_s"] for k, v in timed.items()},
           "mean_s": {k: v["mean_s"] for k, v in timed.items()},
           "flops_per_step": flops, "gflops": {k: flops / v / 1e9 for k, v in medians.items()},
           "fma_peak_gflops_float32": peak_here,
           "fraction_of_fma_peak": {k: flops / v / 1e9 / (peak_here / halved) for k, v in medians.items()},
           "fraction_of_start_peak": {k: flops / v / 1e9 / (peak.at_start / halved) for k, v in medians.items()},
           "ours_over_numpy": ours / medians["numpy"], "core_one_way_ns": [latency_before, latency_after],
           "team_choice": choice}
    if peers:
        row["ours_over_best_peer"] = ours / min(peers)
    return row


def placement(pair: list[float | None]) -> str:
    """"near" (both one-way times before and after a point at most FAR_NS: one core complex), "far"
    (both over it), "mixed" (the host moved the cores during the point) or "one core"."""
    if None in pair:
        return "one core"
    far = [ns > FAR_NS for ns in pair]
    return "far" if all(far) else "near" if not any(far) else "mixed"


def summary(rows: dict[str, dict]) -> dict:
    """Geomean and worst of ours / the best peer, the points over 1.0, and the same by placement
    (a point over 1.0 only where the cores share no L3 is a different problem from one over it near);
    ours' largest mean time per call over its median, and where."""
    ratios = {label: row["ours_over_best_peer"] for label, row in rows.items() if "ours_over_best_peer" in row}
    if not ratios:
        return {}
    worst = max(ratios, key=ratios.get)
    spread = {label: row["mean_s"]["compiled cpu"] / row["median_s"]["compiled cpu"] for label, row in rows.items()}
    widest = max(spread, key=spread.get)
    by_placement: dict[str, dict] = {}
    for label, ratio in ratios.items():
        group = by_placement.setdefault(placement(rows[label]["core_one_way_ns"]), {"points": 0, "over_1": []})
        group["points"] += 1
        if ratio > 1.0:
            group["over_1"].append(label)
    return {"geomean_over_best_peer": math.exp(sum(map(math.log, ratios.values())) / len(ratios)),
            "worst_over_best_peer": ratios[worst], "worst_point": worst,
            "points_over_1": sorted(k for k, v in ratios.items() if v > 1.0), "by_placement": by_placement,
            "ours_mean_over_median_max": spread[widest], "ours_mean_over_median_point": widest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} of the {len(GRID)} points")
    parser.add_argument("--held-out", action="store_true",
                        help=f"{len(HELD_OUT)} points outside the grid, to check that it was not fit")
    parser.add_argument("--smoke", action="store_true", help="one tiny point, once, tiny budgets")
    parser.add_argument("--only", default="", help="points whose label contains this text")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds per contender and point, all rounds")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds over the contenders")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "grid.json"))
    args = parser.parse_args()
    points = SMOKE if args.smoke else QUICK if args.quick else HELD_OUT if args.held_out else GRID
    points = [p for p in points if args.only in p.label]
    if args.smoke:
        args.budget, args.rounds = 0.02, 1
    factories = contenders()
    skipped = {k: v for k, v in factories.items() if isinstance(v, str)}
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}")
    peak = FmaPeak.measure(os.cpu_count() or 1, 10_000 if args.smoke else PEAK_BURST_ITERATIONS)
    results: dict = {"cpu": cpu_model(), "cpus": os.cpu_count(), "threads": len(os.sched_getaffinity(0)),
                     "fma_peak_gflops_float32": peak.at_start, "load_average_start": os.getloadavg(),
                     "budget_s": args.budget, "rounds": args.rounds, "skipped": skipped, "points": {}}
    print(f"{results['cpu']}\nFMA peak {peak.at_start:.0f} GFLOP/s (float32) at the start, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    names = [n for n in ("compiled cpu", *PEERS, "numpy") if n not in skipped]
    print(f"{'point':44s} " + " ".join(f"{n:>12s}" for n in names)
          + f" {'ours/best':>9s} {'GFLOP/s':>8s} {'peak':>5s} {'of':>4s} {'core ns':>9s} placement  threads")
    for point in points:
        start = time.perf_counter()
        row = run_point(point, factories, args.budget, args.rounds, peak)
        row["seconds_with_compile"] = time.perf_counter() - start
        results["points"][point.label] = row
        ratio = row.get("ours_over_best_peer", float("nan"))
        print(f"{point.label:44s} " + " ".join(f"{_us(row['median_s'][n]):>12s}" for n in names)
              + f" {ratio:9.2f} {row['gflops']['compiled cpu']:8.1f} "
              f"{row['fraction_of_fma_peak']['compiled cpu']:5.0%} {row['fma_peak_gflops_float32']:4.0f} "
              f"{_latency(row['core_one_way_ns']):>9s} "
              f"{placement(row['core_one_way_ns']):9s}  {_width(row['team_choice'])}", flush=True)
    results["load_average_end"] = os.getloadavg()
    results["summary"] = summary(results["points"])
    if results["summary"]:
        s = results["summary"]
        print(f"ours / best of PyTorch and JAX: geomean {s['geomean_over_best_peer']:.2f}, worst "
              f"{s['worst_over_best_peer']:.2f} ({s['worst_point']}); points over 1.0: {len(s['points_over_1'])}")
        print(f"ours, mean time per call over the median: at most {s['ours_mean_over_median_max']:.2f} "
              f"({s['ours_mean_over_median_point']})")
        print("by placement: " + "; ".join(f"{name} {g['points']} points, {len(g['over_1'])} over 1.0"
                                           for name, g in sorted(s["by_placement"].items())))
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


def _latency(pair: list[float | None]) -> str:
    """Core-to-core one-way ns before/after a point ("-" with one core)."""
    return "/".join("-" if ns is None else f"{ns:.0f}" for ns in pair)


def _us(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


if __name__ == "__main__":
    main()
