"""Median time of one training step (forward, MSE loss, backward, SGD update) per backend.

Workloads: the moons MLP 2-32-32-16-1 at batch 10 (the demo's step) and an MLP
784-1024-1024-10 at batch 512. Backends: the NumPy reference interpreter, the compiled
CPU backend, a hand-written NumPy step (the same math written directly), PyTorch CPU
and JAX jit when importable (the ``bench`` extra). Also: cold compile time of the moons
step and its disk-cache load time in a new process (medians over fresh processes).

    python benchmarks/step_time.py [--quick] [--json benchmarks/results/step_time.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def median_time(fn: Callable[[], object], budget_s: float, min_reps: int = 5) -> float:
    fn()  # warm up
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if len(times) >= 20000:
            break
    return statistics.median(times)


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

    return jit(step, backend=backend)


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


def process_times(cache: str, warm: bool) -> float:
    """Seconds for a new process to get a callable moons step (compiled cold or loaded from disk)."""
    program = (
        "import time, numpy as np\n"
        "from benchmarks.step_time import mlir_nn_step, data\n"
        "x, y = data([2, 32, 32, 16, 1], 10)\n"
        "step = mlir_nn_step([2, 32, 32, 16, 1], 'cpu')\n"
        "from mlir_nn.backends.cpu import compile_kernel\n"
        "t = time.perf_counter(); c = step.lower(x, y); dt = time.perf_counter() - t\n"
        "print(dt, c.executable.kernel.source)\n"
    )
    env = dict(os.environ, MLIR_NN_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    if not warm:
        for child in Path(cache).iterdir():
            subprocess.run(["rm", "-rf", str(child)], check=True)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    seconds, source = out.stdout.split()
    expected = "disk" if warm else "compiled"
    if source != expected:
        raise RuntimeError(f"expected a {expected} step, got {source}")
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing budgets")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "step_time.json"))
    parser.add_argument("--processes", type=int, default=5, help="fresh processes for compile/load medians")
    args = parser.parse_args()
    budget = 0.5 if args.quick else 2.0
    results: dict = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                     "workloads": {}, "skipped": {}}
    peer_factories = peers()
    for name, reason in peer_factories.items():
        if isinstance(reason, str):
            results["skipped"][name] = reason
            print(f"skipping {name}: {reason}")
    for workload, (sizes, batch) in WORKLOADS.items():
        x, y = data(sizes, batch)
        rows: dict[str, float] = {}
        steps: dict[str, Callable] = {"reference (numpy interpreter)": mlir_nn_step(sizes, "numpy"),
                                      "compiled cpu": mlir_nn_step(sizes, "cpu"),
                                      "hand-written numpy": numpy_step(sizes)}
        steps.update({k: f(sizes) for k, f in peer_factories.items() if not isinstance(f, str)})
        for label, step in steps.items():
            rows[label] = median_time(lambda s=step, x=x, y=y: s(x, y), budget)
        if workload == "mlp-784":
            a = np.random.default_rng(0).standard_normal((batch, 1024)).astype(np.float32)
            b = np.random.default_rng(1).standard_normal((1024, 1024)).astype(np.float32)
            t = median_time(lambda a=a, b=b: a @ b, budget)
            results["numpy_matmul_gflops"] = 2 * batch * 1024 * 1024 / t / 1e9
        flops = flops_per_step(sizes, batch)
        compiled = rows["compiled cpu"]
        results["workloads"][workload] = {
            "sizes": sizes, "batch": batch, "flops_per_step": flops,
            "median_s": rows, "speedup_of_compiled": {k: v / compiled for k, v in rows.items()},
            "gflops": {k: flops / v / 1e9 for k, v in rows.items()},
        }
        print(f"\n{workload}: MLP {'-'.join(map(str, sizes))}, batch {batch}, {flops / 1e6:.2f} MFLOP/step")
        print(f"  {'backend':32s} {'median step':>14s} {'GFLOP/s':>9s} {'time / compiled':>16s}")
        for label, t in rows.items():
            print(f"  {label:32s} {t * 1e6:11.1f} us {flops / t / 1e9:9.2f} {t / compiled:15.2f}x")
    if "numpy_matmul_gflops" in results:
        print(f"\nnumpy (OpenBLAS) 512x1024 @ 1024x1024 matmul: {results['numpy_matmul_gflops']:.1f} GFLOP/s")
    with tempfile.TemporaryDirectory() as cache:
        cold = [process_times(cache, warm=False) for _ in range(args.processes)]
        warm = [process_times(cache, warm=True) for _ in range(args.processes)]
    results["moons_compile_cold_s"] = {"median": statistics.median(cold), "all": cold}
    results["moons_disk_cache_load_s"] = {"median": statistics.median(warm), "all": warm}
    print(f"\nmoons step, new process: cold trace+compile median {statistics.median(cold) * 1e3:.0f} ms "
          f"(all: {', '.join(f'{c * 1e3:.0f}' for c in cold)}); "
          f"trace + disk-cache load median {statistics.median(warm) * 1e3:.1f} ms")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
