"""Median time of one training step (forward, MSE loss, backward, SGD update) per backend.

Workloads: the moons MLP 2-32-32-16-1 at batch 10 (the demo's step) and an MLP
784-1024-1024-10 at batch 512. Backends: the NumPy reference interpreter, the compiled
CPU backend, a hand-written NumPy step (the same math written directly), PyTorch CPU
and JAX jit when importable (the ``bench`` extra). The backends run round-robin (a
slice of each per round) and the reported time is the median of the per-round medians,
so machine load that comes and goes hits all of them alike; minor page faults per step
come from ``resource.getrusage``. Also, in fresh processes: the first step of the moons
step with an empty cache (import + jit + first call; mlir-nn tiered and JAX, alternating;
wall time and the process's own CPU time, which load inflates less), the cold compile of
the moons step with its time per stage, and its disk-cache load time. The package is
byte-compiled first, as an installed one is: fresh processes then time imports, not
the compilation of every module (which ``PYTHONDONTWRITEBYTECODE`` would repeat).

    python benchmarks/step_time.py [--quick | --smoke] [--json benchmarks/results/step_time.json]

``--smoke`` runs everything once on the moons step with tiny budgets (the test suite's
check that the script works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {"moons": ([2, 32, 32, 16, 1], 10), "mlp-784": ([784, 1024, 1024, 10], 512)}
LR = 0.005
SETTLE_S = 0.3  # pause before each turn: OpenBLAS's threads spin on after a NumPy call and take a core


def median_time(fn: Callable[[], object], budget_s: float, min_reps: int = 5) -> float:
    fn()  # warm up
    return timed_slice(fn, budget_s, min_reps)[0]


def timed_slice(fn: Callable[[], object], budget_s: float, min_reps: int = 5) -> tuple[float, float, int, int]:
    """(median seconds per call, seconds of all calls, calls, minor page faults) of calling ``fn`` for
    ``budget_s``."""
    times: list[float] = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if len(times) >= 20000:
            break
    return (statistics.median(times), sum(times), len(times),
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


def round_robin(steps: dict[str, Callable[[], object]], budget_s: float, rounds: int) -> dict[str, dict]:
    """Each step for ``budget_s / rounds`` per round, in turn: the median of the rounds' medians,
    the mean time per call over all rounds (what a training loop sees: the median leaves out calls
    that are slow by design, as a runtime's probes) and the minor page faults per call."""
    for fn in steps.values():
        fn()  # warm up: compile, first-touch the workspace
    medians: dict[str, list[float]] = {label: [] for label in steps}
    calls = dict.fromkeys(steps, 0)
    seconds = dict.fromkeys(steps, 0.0)
    faults = dict.fromkeys(steps, 0)
    for _ in range(rounds):
        for label, fn in steps.items():
            time.sleep(SETTLE_S)
            median, total, n, f = timed_slice(fn, budget_s / rounds, min_reps=3)
            medians[label].append(median)
            seconds[label] += total
            calls[label] += n
            faults[label] += f
    return {label: {"median_s": statistics.median(medians[label]), "round_medians_s": medians[label],
                    "mean_s": seconds[label] / calls[label], "page_faults_per_step": faults[label] / calls[label]}
            for label in steps}


def init_weights(sizes: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params = []
    for nin, nout in zip(sizes, sizes[1:]):
        params += [(rng.standard_normal((nin, nout)) / np.sqrt(nin)).astype(np.float32),
                   np.zeros(nout, np.float32)]
    return params


def data(sizes: list[int], batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.standard_normal((batch, sizes[0])).astype(np.float32),
            rng.standard_normal((batch, sizes[-1])).astype(np.float32))


def mlir_nn_step(sizes: list[int], backend: str) -> Callable[[np.ndarray, np.ndarray], object]:
    from mlir_nn import jit
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    model = MLP(sizes[0], sizes[1:])
    for p, w in zip(model.parameters(), init_weights(sizes)):
        p.data[...] = w
    opt = SGD(model.parameters(), lr=LR)

    step = train_step(model, opt)

    return jit(step, backend=backend, tiered=False)  # compiled from the first call: steady state only


def numpy_step(sizes: list[int]) -> Callable[[np.ndarray, np.ndarray], object]:
    params = init_weights(sizes)
    n_layers = len(sizes) - 1

    def step(x, y):
        acts, pre = [x], []
        h = x
        for i in range(n_layers):
            z = h @ params[2 * i] + params[2 * i + 1]
            pre.append(z)
            h = np.maximum(z, 0) if i < n_layers - 1 else z
            acts.append(h)
        diff = h - y
        loss = np.mean(diff * diff)
        g = diff * np.float32(2.0 / diff.size)
        for i in reversed(range(n_layers)):
            dw = acts[i].T @ g
            db = g.sum(axis=0)
            if i > 0:
                g = (g @ params[2 * i].T) * (pre[i - 1] > 0)
            params[2 * i] -= LR * dw
            params[2 * i + 1] -= LR * db
        return loss

    return step


def torch_step(sizes: list[int]) -> Callable[[np.ndarray, np.ndarray], object]:
    import torch

    layers = []
    for i, (nin, nout) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(nin, nout))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return loss.item()

    return step


def jax_step(sizes: list[int]) -> Callable[[np.ndarray, np.ndarray], object]:
    import jax
    import jax.numpy as jnp

    params = [jnp.asarray(p) for p in init_weights(sizes)]
    n_layers = len(sizes) - 1

    def loss_fn(ps, x, y):
        h = x
        for i in range(n_layers):
            h = h @ ps[2 * i] + ps[2 * i + 1]
            if i < n_layers - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def update(ps, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        return [p - LR * g for p, g in zip(ps, grads)], loss

    state = {"ps": params}

    def step(x, y):
        state["ps"], loss = update(state["ps"], x, y)
        return float(loss)

    return step


def peers() -> dict[str, Callable[[list[int]], Callable] | str]:
    """Optional peers: a factory, or the reason it is skipped."""
    found: dict[str, Callable[[list[int]], Callable] | str] = {}
    for name, module, factory in (("pytorch-cpu", "torch", torch_step), ("jax-jit", "jax", jax_step)):
        try:
            __import__(module)
            found[name] = factory
        except ImportError as error:
            found[name] = f"not installed ({error}); pip install '.[bench]'"
    return found


def flops_per_step(sizes: list[int], batch: int) -> float:
    """Multiply-adds x2 of forward, weight-gradient and input-gradient products."""
    total = 0
    for i, (nin, nout) in enumerate(zip(sizes, sizes[1:])):
        total += 2 * batch * nin * nout * (2 if i == 0 else 3)
    return float(total)


def _run_fresh(program: str, cache: str, clear: bool, *args: str) -> list[str]:
    """stdout words of ``program`` run in a new Python process (``args`` its ``sys.argv[1:]``) with
    ``cache`` as its compile cache."""
    env = dict(os.environ, MLIR_NN_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    if clear:
        for child in Path(cache).iterdir():
            subprocess.run(["rm", "-rf", str(child)], check=True)
    out = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return out.stdout.split()


COMPILE = (  # trace + optimize + compile; "cold" imports egglog and MLIR first, timed as stages of their own
    "import json, sys, time\n"
    "imports = {}\n"
    "for module in (('egglog', 'mlir.execution_engine') if sys.argv[1] == 'cold' else ()):\n"
    "    t = time.perf_counter(); __import__(module); imports['import-' + module] = time.perf_counter() - t\n"
    "from benchmarks.step_time import mlir_nn_step, data\n"
    "x, y = data([2, 32, 32, 16, 1], 10)\n"
    "step = mlir_nn_step([2, 32, 32, 16, 1], 'cpu')\n"
    "t = time.perf_counter(); c = step.lower(x, y); dt = time.perf_counter() - t\n"
    "stages = dict(imports, **c.executable.kernel.timings)\n"
    "stages['egglog'] = c.optimize_report.seconds if c.optimize_report else 0.0\n"
    "print(dt + sum(imports.values()), c.executable.kernel.source, json.dumps(stages).replace(' ', ''))\n"
)

FIRST_STEP = {  # import + jit + the first step, timed from the program's first line
    "mlir-nn (tiered)": (
        "import time; start = time.perf_counter()\n"
        "import numpy as np\n"
        "from mlir_nn import jit\nfrom mlir_nn.nn import MLP\nfrom mlir_nn.optim import SGD\n"
        "from mlir_nn.trainer import train_step\n"
        "model = MLP(2, [32, 32, 16, 1])\n"
        "step = jit(train_step(model, SGD(model.parameters(), lr=0.005)), tiered=True)\n"
        "step(np.ones((10, 2), np.float32), np.ones((10, 1), np.float32))\n"
        "import resource; r = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(time.perf_counter() - start, r.ru_utime + r.ru_stime, step._last.tier)\n"),
    "jax-jit": (
        "import time; start = time.perf_counter()\n"
        "import numpy as np\n"
        "from benchmarks.step_time import jax_step, data\n"
        "x, y = data([2, 32, 32, 16, 1], 10)\n"
        "jax_step([2, 32, 32, 16, 1])(x, y)\n"
        "import resource; r = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(time.perf_counter() - start, r.ru_utime + r.ru_stime, 'jit')\n"),
}


def process_times(cache: str, warm: bool) -> tuple[float, dict[str, float]]:
    """Seconds for a new process to get a callable moons step (compiled cold or loaded from disk),
    and the seconds per compile stage."""
    seconds, source, stages = _run_fresh(COMPILE, cache, not warm, "warm" if warm else "cold")
    expected = "disk" if warm else "compiled"
    if source != expected:
        raise RuntimeError(f"expected a {expected} step, got {source}")
    return float(seconds), json.loads(stages)


def first_step_times(cache: str, processes: int, peers_found: dict) -> dict[str, dict[str, list[float]]]:
    """Per peer, wall and CPU seconds to the end of the first moons step in fresh processes with
    an empty cache, the peers taking turns."""
    programs = {label: program for label, program in FIRST_STEP.items()
                if not (label == "jax-jit" and isinstance(peers_found.get("jax-jit"), str))}
    times: dict[str, dict[str, list[float]]] = {label: {"wall": [], "cpu": []} for label in programs}
    for _ in range(processes):
        for label, program in programs.items():
            wall, cpu, _ = _run_fresh(program, cache, clear=True)
            times[label]["wall"].append(float(wall))
            times[label]["cpu"].append(float(cpu))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing budgets")
    parser.add_argument("--smoke", action="store_true", help="the moons step only, everything once, tiny budgets")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "step_time.json"))
    parser.add_argument("--processes", type=int, default=5, help="fresh processes for compile/load medians")
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds over the backends")
    args = parser.parse_args()
    budget = 0.05 if args.smoke else 1.0 if args.quick else 5.0  # seconds per backend and workload, all rounds
    if args.smoke:
        args.processes, args.rounds = 1, 1
    workloads = {"moons": WORKLOADS["moons"]} if args.smoke else WORKLOADS
    results: dict = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                     "load_average": os.getloadavg(), "workloads": {}, "skipped": {}}
    peer_factories = peers()
    for name, reason in peer_factories.items():
        if isinstance(reason, str):
            results["skipped"][name] = reason
            print(f"skipping {name}: {reason}")
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for workload, (sizes, batch) in workloads.items():
        x, y = data(sizes, batch)
        steps: dict[str, Callable] = {"reference (numpy interpreter)": mlir_nn_step(sizes, "numpy"),
                                      "compiled cpu": mlir_nn_step(sizes, "cpu"),
                                      "hand-written numpy": numpy_step(sizes)}
        steps.update({k: f(sizes) for k, f in peer_factories.items() if not isinstance(f, str)})
        timed = round_robin({label: (lambda s=step, x=x, y=y: s(x, y)) for label, step in steps.items()},
                            budget, args.rounds)
        rows = {label: row["median_s"] for label, row in timed.items()}
        if workload == "mlp-784":
            a = np.random.default_rng(0).standard_normal((batch, 1024)).astype(np.float32)
            b = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
            t = median_time(lambda a=a, b=b: a @ b, budget / 5)
            results["numpy_matmul_gflops"] = 2 * batch * 1024 * 1024 / t / 1e9
        flops = flops_per_step(sizes, batch)
        compiled = rows["compiled cpu"]
        results["workloads"][workload] = {
            "sizes": sizes, "batch": batch, "flops_per_step": flops, "median_s": rows,
            "round_medians_s": {k: v["round_medians_s"] for k, v in timed.items()},
            "page_faults_per_step": {k: v["page_faults_per_step"] for k, v in timed.items()},
            "speedup_of_compiled": {k: v / compiled for k, v in rows.items()},
            "gflops": {k: flops / v / 1e9 for k, v in rows.items()},
        }
        print(f"\n{workload}: MLP {'-'.join(map(str, sizes))}, batch {batch}, {flops / 1e6:.2f} MFLOP/step, "
              f"{args.rounds} rounds")
        print(f"  {'backend':32s} {'median step':>14s} {'GFLOP/s':>9s} {'time / compiled':>16s} {'faults/step':>12s}")
        for label, t in rows.items():
            faults = timed[label]["page_faults_per_step"]
            print(f"  {label:32s} {t * 1e6:11.1f} us {flops / t / 1e9:9.2f} {t / compiled:15.2f}x {faults:12.1f}")
    if "numpy_matmul_gflops" in results:
        print(f"\nnumpy (OpenBLAS) 512x1024 @ 1024x1024 matmul: {results['numpy_matmul_gflops']:.1f} GFLOP/s")
    compileall.compile_dir(ROOT / "mlir_nn", quiet=1)
    compileall.compile_dir(ROOT / "benchmarks", quiet=1)
    with tempfile.TemporaryDirectory() as cache:
        first = first_step_times(cache, args.processes, peer_factories)
        cold = [process_times(cache, warm=False) for _ in range(args.processes)]
        warm = [process_times(cache, warm=True)[0] for _ in range(args.processes)]
    cold_s = [c[0] for c in cold]
    stages = {k: statistics.median(c[1].get(k, 0.0) for c in cold) for k in cold[0][1]}
    results["moons_first_step_fresh_process_s"] = {
        k: {"median": statistics.median(v["wall"]), "all": v["wall"], "cpu_median": statistics.median(v["cpu"]),
            "cpu_all": v["cpu"]} for k, v in first.items()}
    results["moons_compile_cold_s"] = {"median": statistics.median(cold_s), "all": cold_s, "stages": stages}
    results["moons_disk_cache_load_s"] = {"median": statistics.median(warm), "all": warm}
    print("\nmoons step, first step in a new process with an empty cache (import + jit + first call):")
    for label, times in first.items():
        print(f"  {label:20s} median {statistics.median(times['wall']) * 1e3:.0f} ms "
              f"(all: {', '.join(f'{t * 1e3:.0f}' for t in times['wall'])}); its CPU time median "
              f"{statistics.median(times['cpu']) * 1e3:.0f} ms")
    print(f"moons step, new process: cold trace+compile median {statistics.median(cold_s) * 1e3:.0f} ms "
          f"(all: {', '.join(f'{c * 1e3:.0f}' for c in cold_s)}); "
          f"trace + disk-cache load median {statistics.median(warm) * 1e3:.1f} ms")
    rest = statistics.median(cold_s) - sum(stages.values())  # tracing, the optimizer cache, loading the code
    print("  cold compile per stage (median ms): " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in stages.items())
          + f", the rest {rest * 1e3:.0f}")
    print(f"load average at end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
