"""Cold compile time against JAX, and how soon a fresh process has trained, against PyTorch and JAX.

1. First call, cold: a fresh process with an empty compile cache traces an MLP training
   step (MSE loss, SGD or Adam, batch 128) and returns its first call's result; JAX's first
   call of the same step under ``jax.jit`` (hand-written SGD/Adam) is timed the same way.
   Imports are excluded for both; each is also given with them ("with imports": from before
   the script's ``import numpy`` to the first call's end, the framework's import, the model
   and the data included), since JAX loads its compiler in ``import jax`` and mlir-nn loads
   MLIR at its first compile. ``--first-tier`` says what runs mlir-nn's first call
   (the tier is printed with it): ``interpreter`` (the default, as for users) runs the
   traced graph on the reference ops at once while another process optimizes and compiles
   it; ``native`` (``MLIR_NN_FIRST_TIER=native``) first compiles the traced graph in this
   process with few passes and LLVM at -O0, then starts the process that compiles the
   optimized code; ``off`` (``MLIR_NN_TIERED=0``) compiles the optimized code before the
   first call. "optimized" is when the step runs the optimized code (the time
   from the first call until ``lower`` has waited for it). mlir-nn's first call is also
   given per stage when it compiled (egraph, codegen, passes, llvm, link; imports: of egglog,
   MLIR and the package's compile modules, which those stages' clocks leave out; "other" is
   the rest: tracing, the executable, the call).
   MLPs: ``depth`` hidden layers of ``width`` units, input ``width``, 10 outputs.
2. Time to train: a fresh process (imports included, empty cache, mlir-nn with its default
   tiers) until 200 steps of the autoencoder 784-256-64-16-64-256-784 (Adam, batch 128)
   are done, against PyTorch eager and JAX; with what ran mlir-nn's last step ("numpy":
   the interpreter tier still, "cpu": the optimized code).

Caches start empty: mlir-nn then also builds its two C helpers, which it does once per
machine; ``--seed-machine-builds`` starts each cache with them (a new step on a machine
where mlir-nn has run before). Each model's runs alternate between the frameworks (the
order flips every repeat), so load that comes and goes hits both; results are ratios, with
the CPU model and the load average noted.

With several depths of one width (the full grid, or ``--models 1x64,2x64,4x64,8x64,16x64``),
the cost of each added layer between consecutive depths is printed for both: compile time
that grows at most linearly with depth has increments that do not grow with depth.

    python benchmarks/compile_time.py [--quick | --smoke | --models 1x64,8x64] [--optimizers sgd,adam]
                                      [--repeats N] [--seed-machine-builds] [--steps N (0: no training)]
                                      [--first-tier interpreter|native|off]
                                      [--json benchmarks/results/compile_time.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 128
AUTOENCODER = [784, 256, 64, 16, 64, 256, 784]

_SETUP = """
import json, sys, time
start = time.perf_counter()
import numpy as np
sizes, optimizer, steps = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
x = rng.standard_normal((BATCH, sizes[0])).astype(np.float32)
y = rng.standard_normal((BATCH, sizes[-1])).astype(np.float32)
""".replace("BATCH", str(BATCH))

MLIR_NN = _SETUP + """
import mlir_nn
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step
model = MLP(sizes[0], sizes[1:])
opt = (Adam if optimizer == "adam" else SGD)(model.parameters(), lr=1e-3)
step = mlir_nn.jit(train_step(model, opt, mse_loss))
import builtins
plain_import, importing = builtins.__import__, [0, 0.0]  # depth, seconds of outermost imports
def timed_import(*args, **kwargs):
    importing[0] += 1
    begin = time.perf_counter()
    try:
        return plain_import(*args, **kwargs)
    finally:
        importing[0] -= 1
        if not importing[0]:
            importing[1] += time.perf_counter() - begin
builtins.__import__ = timed_import
imported = time.perf_counter()
step(x, y)
first = time.perf_counter() - imported
builtins.__import__ = plain_import
for _ in range(steps - 1):
    step(x, y)
report = {"first": first, "total": time.perf_counter() - start, "last_tier": step._last.tier}
if steps == 1:  # what ran the first call, its stages, and when the optimized code runs
    ran = step._last
    report["tier"] = ran.tier
    report["stages"] = {"egraph": ran.optimize_report.seconds if ran.optimize_report else 0.0}
    kernel = getattr(ran.executable, "kernel", None)  # none on the interpreter
    report["stages"].update(kernel.timings if kernel else {})
    report["stages"]["imports"] = importing[1]  # of egglog and MLIR: outside the stages' clocks
    step.lower(x, y)
    report["optimized"] = time.perf_counter() - imported
print(json.dumps(report))
"""

JAX = _SETUP + """
import jax, jax.numpy as jnp
key = jax.random.PRNGKey(0)
params = []
for n_in, n_out in zip(sizes, sizes[1:]):
    key, k = jax.random.split(key)
    bound = 1 / n_in ** 0.5
    params.append((jax.random.uniform(k, (n_in, n_out), minval=-bound, maxval=bound), jnp.zeros(n_out)))
def loss_fn(ps, x, y):
    h = x
    for i, (w, b) in enumerate(ps):
        h = h @ w + b
        if i < len(ps) - 1:
            h = jax.nn.relu(h)
    return jnp.mean((h - y) ** 2)
def sgd(ps, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, ps, grads), state, loss
def adam(ps, state, x, y):
    m, v, t = state
    loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
    t = t + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
    scale = 1e-3 * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
    ps = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8), ps, m, v)
    return ps, (m, v, t), loss
def zeros():
    return jax.tree.map(jnp.zeros_like, params)
state = (zeros(), zeros(), jnp.float32(0)) if optimizer == "adam" else ()
step = jax.jit(adam if optimizer == "adam" else sgd, donate_argnums=(0, 1))
imported = time.perf_counter()
params, state, loss = step(params, state, x, y)
loss.block_until_ready()
first = time.perf_counter() - imported
for _ in range(steps - 1):
    params, state, loss = step(params, state, x, y)
loss.block_until_ready()
print(json.dumps({"first": first, "total": time.perf_counter() - start, "optimized": first, "stages": {}}))
"""

TORCH = _SETUP + """
import torch
layers = []
for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
    layers.append(torch.nn.Linear(n_in, n_out))
    if i < len(sizes) - 2:
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers)
opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(model.parameters(), lr=1e-3)
xt, yt = torch.from_numpy(x), torch.from_numpy(y)
imported = time.perf_counter()
for i in range(steps):
    loss = torch.nn.functional.mse_loss(model(xt), yt)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if i == 0:
        first = time.perf_counter() - imported
print(json.dumps({"first": first, "total": time.perf_counter() - start, "stages": {}}))
"""

PROGRAMS = {"mlir-nn": MLIR_NN, "jax": JAX, "torch": TORCH}


MACHINE_BUILDS = ("thin-call", "task-runtime", "gemm")  # C helpers that mlir-nn builds once per machine
_SEED: list[Path] = []  # a cache folder holding only those, when --seed-machine-builds


def seed_machine_builds(folder: Path) -> None:
    """Build mlir-nn's once-per-machine C helpers into ``folder`` (a tiny step compiled there);
    each run's cache then starts with them and without any step."""
    # the native first tier builds all three (its products call the C GEMM); the step's compile, run to the end
    env = dict(os.environ, MLIR_NN_CACHE_DIR=str(folder), MLIR_NN_TIERED="1", MLIR_NN_FIRST_TIER="native",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", MLIR_NN, "[2, 3, 1]", "sgd", "1"], check=True, capture_output=True, env=env)
    _SEED.append(folder)


def run_fresh(framework: str, sizes: list[int], optimizer: str, steps: int, tiers: dict[str, str]) -> dict:
    """One fresh process, with an empty compile cache (but for the seeded machine builds) and
    mlir-nn's tier settings ``tiers`` (environment variables); its report plus the wall time
    it took."""
    with tempfile.TemporaryDirectory() as cache:
        for seed in _SEED:
            for name in MACHINE_BUILDS:
                if (seed / name).is_dir():
                    shutil.copytree(seed / name, Path(cache) / name)
        env = dict(os.environ, MLIR_NN_CACHE_DIR=cache, **tiers,
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   JAX_PLATFORMS="cpu")
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROGRAMS[framework], json.dumps(sizes), optimizer, str(steps)],
                              capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{framework} {sizes} {optimizer} failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["wall"] = wall
    return report


def interleaved(frameworks: list[str], sizes: list[int], optimizer: str, steps: int, repeats: int,
                tiers: dict[str, str]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {f: [] for f in frameworks}
    for r in range(repeats):
        for framework in frameworks if r % 2 == 0 else frameworks[::-1]:
            runs[framework].append(run_fresh(framework, sizes, optimizer, steps, tiers))
    return runs


def available(framework: str) -> bool:
    module = {"mlir-nn": "numpy", "jax": "jax", "torch": "torch"}[framework]
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


FIRST_TIERS = {"interpreter": {"MLIR_NN_TIERED": "1", "MLIR_NN_FIRST_TIER": "interpreter"},
               "native": {"MLIR_NN_TIERED": "1", "MLIR_NN_FIRST_TIER": "native"}, "off": {"MLIR_NN_TIERED": "0"}}


def first_calls(models: list[tuple[int, int]], optimizers: list[str], repeats: int, first_tier: str) -> list[dict]:
    rows = []
    for optimizer in optimizers:
        for depth, width in models:
            sizes = [width] + [width] * depth + [10]
            runs = interleaved(["mlir-nn", "jax"], sizes, optimizer, 1, repeats, FIRST_TIERS[first_tier])
            ours = statistics.median(r["first"] for r in runs["mlir-nn"])
            optimized = statistics.median(r["optimized"] for r in runs["mlir-nn"])
            jax = statistics.median(r["first"] for r in runs["jax"])
            ours_total, jax_total = (statistics.median(r["total"] for r in runs[f]) for f in ("mlir-nn", "jax"))
            stages = {k: statistics.median(r["stages"].get(k, 0.0) for r in runs["mlir-nn"])
                      for k in runs["mlir-nn"][0]["stages"]}
            stages["other"] = max(0.0, ours - sum(stages.values()))
            tiers = sorted({r["tier"] for r in runs["mlir-nn"]})
            row = {"depth": depth, "width": width, "optimizer": optimizer, "first_tier": "/".join(tiers),
                   "mlir_nn_s": ours, "mlir_nn_optimized_s": optimized, "jax_s": jax,
                   "ratio": ours / jax, "optimized_ratio": optimized / jax, "stages_s": stages,
                   "mlir_nn_with_imports_s": ours_total, "jax_with_imports_s": jax_total,
                   "with_imports_ratio": ours_total / jax_total, "load": os.getloadavg()[0]}
            rows.append(row)
            parts = " ".join(f"{k} {v:.2f}" for k, v in stages.items())
            print(f"{optimizer:4} depth {depth:2} width {width:4}: mlir-nn {ours:6.2f} s ({row['first_tier']}), "
                  f"optimized at {optimized:6.2f} s  jax {jax:5.2f} s  ratio {ours / jax:5.2f} "
                  f"(optimized {optimized / jax:5.2f}; with imports {ours_total:5.2f} / {jax_total:5.2f} s, "
                  f"{ours_total / jax_total:5.2f})  ({parts})  load {row['load']:.2f}", flush=True)
    return rows


def depth_growth(rows: list[dict]) -> list[str]:
    """Per optimizer and width with two depths or more: the seconds each added layer costs
    between consecutive depths, mlir-nn's first call, its optimized code and JAX's."""
    lines = []
    for optimizer, width in sorted({(r["optimizer"], r["width"]) for r in rows}):
        runs = sorted((r for r in rows if (r["optimizer"], r["width"]) == (optimizer, width)), key=lambda r: r["depth"])
        steps = []
        for low, high in zip(runs, runs[1:]):
            layers = high["depth"] - low["depth"]
            steps.append(f"{low['depth']}->{high['depth']}: " + " / ".join(
                f"{(high[key] - low[key]) / layers:+.3f}" for key in ("mlir_nn_s", "mlir_nn_optimized_s", "jax_s")))
        if steps:
            lines.append(f"{optimizer:4} width {width:4}, s per added layer (first call / optimized / JAX): "
                         + ", ".join(steps))
    return lines


def parse_models(text: str) -> list[tuple[int, int]]:
    """``1x64,8x64`` -> [(1, 64), (8, 64)]: depth x width."""
    try:
        models = [tuple(int(n) for n in item.split("x")) for item in text.split(",")]
    except ValueError:
        models = []
    if not models or any(len(m) != 2 or min(m) < 1 for m in models):
        raise argparse.ArgumentTypeError(f"expected depth x width pairs such as 1x64,8x64, got {text!r}")
    return [(depth, width) for depth, width in models]


def time_to_train(steps: int, repeats: int, sizes: list[int]) -> dict:
    frameworks = [f for f in ("mlir-nn", "torch", "jax") if available(f)]
    tiers = {"MLIR_NN_TIERED": "1"}  # the default tiers (MLIR_NN_FIRST_TIER as set for this script)
    runs = interleaved(frameworks, sizes, "adam", steps, repeats, tiers)
    walls = {f: statistics.median(r["wall"] for r in runs[f]) for f in frameworks}
    last_tiers = sorted({r["last_tier"] for r in runs["mlir-nn"]})  # what ran mlir-nn's last step
    for f, wall in walls.items():
        ratio = "" if "torch" not in walls else f"  ({wall / walls['torch']:.2f}x PyTorch)"
        ran = f", last step on {'/'.join(last_tiers)}" if f == "mlir-nn" else ""
        print(f"{steps} steps of MLP {'-'.join(map(str, sizes))}, Adam, fresh process: {f:8} {wall:6.2f} s{ratio}"
              f"{ran}", flush=True)
    return {"steps": steps, "sizes": sizes, "wall_s": walls, "mlir_nn_last_tier": "/".join(last_tiers),
            "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few models, Adam only, one repeat")
    parser.add_argument("--smoke", action="store_true", help="one tiny model and 3 steps (the test suite's check)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per framework and model (default 3, quick 1)")
    parser.add_argument("--models", type=parse_models, default=None,
                        help="depth x width pairs instead of the grid, e.g. 1x64,2x64,4x64,8x64,16x64")
    parser.add_argument("--optimizers", default=None, help="sgd, adam or sgd,adam (default: the grid's)")
    parser.add_argument("--steps", type=int, default=200, help="training steps of the time-to-train run (0: none)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "compile_time.json"))
    parser.add_argument("--first-tier", choices=sorted(FIRST_TIERS), default="interpreter",
                        help="mlir-nn's first call on the interpreter (the default tier), on quick native code, "
                             "or on the optimized code compiled before it")
    parser.add_argument("--seed-machine-builds", action="store_true",
                        help="start each mlir-nn cache with the C helpers it builds once per machine")
    args = parser.parse_args()
    if not available("jax"):
        sys.exit("compile_time.py compares against JAX: install it (the bench extra)")
    seed_folder = tempfile.TemporaryDirectory()
    if args.seed_machine_builds:
        seed_machine_builds(Path(seed_folder.name))
    repeats = args.repeats or (1 if args.quick or args.smoke else 3)
    if args.smoke:
        models, optimizers, args.steps = [(1, 16)], ["sgd"], 3
    elif args.quick:
        models, optimizers = [(1, 16), (4, 256), (8, 64)], ["adam"]
    else:
        models = [(d, w) for d in (1, 2, 4, 8, 16) for w in (16, 64, 256, 1024)]
        optimizers = ["sgd", "adam"]
    models = args.models or models
    optimizers = args.optimizers.split(",") if args.optimizers else optimizers
    if set(optimizers) - {"sgd", "adam"}:
        parser.error(f"--optimizers takes sgd and adam, got {args.optimizers!r}")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()}", flush=True)
    rows = first_calls(models, optimizers, repeats, args.first_tier)
    ratios = [r["ratio"] for r in rows]
    geomean = statistics.geometric_mean(ratios)
    optimized = statistics.geometric_mean(r["optimized_ratio"] for r in rows)
    with_imports = [r["with_imports_ratio"] for r in rows]
    with_imports_geomean = statistics.geometric_mean(with_imports)
    print(f"first call, mlir-nn / JAX: geomean {geomean:.2f}, worst {max(ratios):.2f}; "
          f"optimized code running: geomean {optimized:.2f}; with imports: geomean "
          f"{with_imports_geomean:.2f}, worst {max(with_imports):.2f}")
    for line in depth_growth(rows):
        print(line)
    train = time_to_train(args.steps, repeats, [16, 8, 16] if args.smoke else AUTOENCODER) if args.steps else None
    results = {"cpu": cpu_model(), "cores": os.cpu_count(), "batch": BATCH, "repeats": repeats,
               "machine_builds_seeded": args.seed_machine_builds,
               "first_tier": args.first_tier, "first_calls": rows, "geomean_ratio": geomean,
               "geomean_optimized_ratio": optimized, "geomean_with_imports_ratio": with_imports_geomean,
               "time_to_train": train,
               "load_average_end": os.getloadavg()}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"load average at end: {os.getloadavg()}; wrote {args.json}")


if __name__ == "__main__":
    main()
