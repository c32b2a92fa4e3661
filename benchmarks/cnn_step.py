"""Median time of one CNN training step (forward, backward, SGD with momentum), compiled CPU
against PyTorch CPU (eager, and torch.compile where it runs) and JAX (jit) when installed.

Points: LeNet-5 on 1x28x28 inputs at batch 64 and 256, and a small VGG-style net on 3x32x32
inputs (3x3 convolutions with 32, 64 and 128 channels, each followed by ReLU and 2x2 max
pooling, then one linear layer) at batch 128. Synthetic data, float32, every contender
starting from the same weights. Contenders run round-robin (``matmul_table.round_robin``)
so that load changes hit all alike; the table gives each one's median step time, its ratio
to the best peer, and GFLOP/s against the FMA loop peak of the threads used.

    python benchmarks/cnn_step.py [--quick | --smoke] [--only lenet] [--no-compile] [--dynamic] [--threads N]
                                  [--json FILE]

``--threads N`` runs mlir-nn and PyTorch on N threads (and, with N = 1, JAX with its Eigen pool
off): on a loaded machine a contender's threads wait at barriers for a busy core (PyTorch's
spin), which can cost more than its compute; one thread each compares the kernels alone.

``--smoke`` runs LeNet-5 at batch 4 once against PyTorch eager (the test suite's check that
the script works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.matmul_table import fma_peak, round_robin  # noqa: E402

# A layer spec: ("conv", in, out, kernel, padding) with ReLU, ("pool",) 2x2 max, ("linear", in, out, relu)
LENET = [("conv", 1, 6, 5, 2), ("pool",), ("conv", 6, 16, 5, 0), ("pool",),
         ("linear", 400, 120, True), ("linear", 120, 84, True), ("linear", 84, 10, False)]
VGG = [("conv", 3, 32, 3, 1), ("pool",), ("conv", 32, 64, 3, 1), ("pool",), ("conv", 64, 128, 3, 1), ("pool",),
       ("linear", 2048, 10, False)]
POINTS = {"lenet5 b64": (LENET, (1, 28, 28), 64), "lenet5 b256": (LENET, (1, 28, 28), 256),
          "vgg-small b128": (VGG, (3, 32, 32), 128)}
LR, MOMENTUM = 0.01, 0.9


def initial_weights(spec: list[tuple], seed: int = 0) -> list[np.ndarray]:
    """PyTorch's default init, PyTorch's layouts: conv (out, in, k, k), linear (out, in), biases."""
    rng = np.random.default_rng(seed)
    weights = []
    for layer in spec:
        if layer[0] == "pool":
            continue
        shape = (layer[2], layer[1], layer[3], layer[3]) if layer[0] == "conv" else (layer[2], layer[1])
        bound = 1 / np.sqrt(np.prod(shape[1:]))
        weights += [rng.uniform(-bound, bound, shape).astype(np.float32),
                    rng.uniform(-bound, bound, shape[0]).astype(np.float32)]
    return weights


def flops(spec: list[tuple], image: tuple[int, int, int], batch: int) -> float:
    """Multiply-adds x 2 of the convolutions and linear layers: forward, weight and input
    gradients (no input gradient for the first layer)."""
    c, h, w = image
    total, first = 0.0, True
    for layer in spec:
        if layer[0] == "pool":
            h, w = h // 2, w // 2
            continue
        if layer[0] == "conv":
            _, cin, cout, k, pad = layer
            h, w = h + 2 * pad - k + 1, w + 2 * pad - k + 1
            macs = batch * cout * h * w * cin * k * k
        else:
            macs = batch * layer[1] * layer[2]
        total += 2 * macs * (2 if first else 3)
        first = False
    return total


def data(image: tuple[int, int, int], batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((batch,) + image).astype(np.float32), rng.integers(0, 10, batch).astype(np.float32)


def mlir_nn_step(spec: list[tuple], weights: list[np.ndarray], x: np.ndarray, y: np.ndarray,
                 dynamic_batch: bool) -> Callable[[], object]:
    import mlir_nn
    from mlir_nn.engine import Tensor, conv2d, max_pool2d
    from mlir_nn.losses import cross_entropy
    from mlir_nn.optim import SGD

    params = [Tensor(w.copy()) for w in weights]

    def model(h: Tensor) -> Tensor:
        i = 0
        for layer in spec:
            if layer[0] == "pool":
                h = max_pool2d(h, 2)
            elif layer[0] == "conv":
                h = conv2d(h, params[i], params[i + 1], padding=layer[4]).relu()
                i += 2
            else:
                h = h.reshape(h.shape[0], layer[1]) if h.ndim != 2 else h
                h = h @ params[i].T + params[i + 1]
                h = h.relu() if layer[3] else h
                i += 2
        return h

    opt = SGD(params, lr=LR, momentum=MOMENTUM)

    def step(xb: Tensor, yb: Tensor) -> Tensor:
        loss = cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    compiled = mlir_nn.jit(step, tiered=False, dynamic_batch=dynamic_batch)
    compiled(x, y)  # compiles
    return lambda: compiled(x, y)


def torch_steps(spec: list[tuple], weights: list[np.ndarray], x: np.ndarray, y: np.ndarray,
                with_compile: bool, threads: int) -> dict[str, Callable[[], object]]:
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(threads)

    def build() -> torch.nn.Module:
        layers: list[torch.nn.Module] = []
        for layer in spec:
            if layer[0] == "pool":
                layers.append(torch.nn.MaxPool2d(2))
            elif layer[0] == "conv":
                layers += [torch.nn.Conv2d(layer[1], layer[2], layer[3], padding=layer[4]), torch.nn.ReLU()]
            else:
                if not any(isinstance(m, torch.nn.Flatten) for m in layers):
                    layers.append(torch.nn.Flatten())
                layers += [torch.nn.Linear(layer[1], layer[2])] + ([torch.nn.ReLU()] if layer[3] else [])
        model = torch.nn.Sequential(*layers)
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(torch.from_numpy(w))
        return model

    xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))

    def stepper(model: torch.nn.Module, forward: Callable) -> Callable[[], object]:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

        def step() -> object:
            loss = torch.nn.functional.cross_entropy(forward(xt), yt)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return step

    eager = build()
    steps = {"torch eager": stepper(eager, eager)}
    if with_compile:
        compiled_model = build()
        try:
            step = stepper(compiled_model, torch.compile(compiled_model))
            step()
            steps["torch.compile"] = step
        except Exception as e:  # no C++ compiler, unsupported platform: say so and go on
            print(f"  torch.compile does not run here: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return steps


def jax_step(spec: list[tuple], weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> Callable[[], object] | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    def model(params: list, h: jax.Array) -> jax.Array:
        i = 0
        for layer in spec:
            if layer[0] == "pool":
                h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
            elif layer[0] == "conv":
                pad = [(layer[4], layer[4])] * 2
                h = jax.lax.conv_general_dilated(h, params[i], (1, 1), pad, dimension_numbers=("NCHW", "OIHW", "NCHW"))
                h = jax.nn.relu(h + params[i + 1][None, :, None, None])
                i += 2
            else:
                h = h.reshape(h.shape[0], -1) @ params[i].T + params[i + 1]
                h = jax.nn.relu(h) if layer[3] else h
                i += 2
        return h

    def loss_fn(params: list, xb: jax.Array, yb: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(model(params, xb))
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    @jax.jit
    def step(params: list, velocity: list, xb: jax.Array, yb: jax.Array) -> tuple:
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        velocity = [MOMENTUM * v + g for v, g in zip(velocity, grads)]
        return [p - LR * v for p, v in zip(params, velocity)], velocity, loss

    state = {"params": [jnp.asarray(w) for w in weights], "velocity": [jnp.zeros_like(jnp.asarray(w)) for w in weights]}
    xj, yj = jnp.asarray(x), jnp.asarray(y.astype(np.int32))

    def run() -> object:
        state["params"], state["velocity"], loss = step(state["params"], state["velocity"], xj, yj)
        return loss.block_until_ready()

    return run


def limit_threads(threads: int) -> None:
    """Every contender on ``threads`` threads: set before any of them starts its pool."""
    if threads < 1:
        raise SystemExit(f"--threads must be positive, got {threads}")
    os.environ["MLIR_NN_NUM_THREADS"] = str(threads)
    if threads == 1:  # XLA's CPU client has no thread count, only Eigen's pool on or off
        os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                                          "--xla_cpu_multi_thread_eigen=false"]))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--smoke", action="store_true", help="LeNet-5 at batch 4 once, PyTorch eager only")
    parser.add_argument("--only", default="", help="run only the points whose label contains this text")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compile takes minutes)")
    parser.add_argument("--dynamic", action="store_true", help="also time the step compiled for any batch size")
    parser.add_argument("--threads", type=int, help="threads of every contender (default: the usable cores)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rounds, reps = (1, 1) if args.smoke else (3, 2) if args.quick else (7, 5)
    points = {"lenet5 b4": (LENET, (1, 28, 28), 4)} if args.smoke else POINTS
    threads = args.threads or len(os.sched_getaffinity(0))
    limit_threads(threads)
    peak = fma_peak(threads)
    print(f"CPU: {cpu_model()}, {threads} threads; FMA loop peak {peak:.1f} GFLOP/s (float32); "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    results = {}
    for label, (spec, image, batch) in points.items():
        if args.only not in label:
            continue
        weights = initial_weights(spec)
        x, y = data(image, batch)
        contenders = {"mlir-nn cpu": mlir_nn_step(spec, weights, x, y, dynamic_batch=False)}
        if args.dynamic:
            contenders["mlir-nn cpu (any batch)"] = mlir_nn_step(spec, weights, x, y, dynamic_batch=True)
        contenders.update(torch_steps(spec, weights, x, y, not (args.no_compile or args.smoke), threads))
        jax_run = None if args.smoke else jax_step(spec, weights, x, y)
        if jax_run is not None:
            contenders["jax jit"] = jax_run
        times = round_robin(contenders, rounds, reps)
        peers = {k: t for k, t in times.items() if not k.startswith("mlir-nn")}
        best = min(peers.values()) if peers else float("nan")
        work = flops(spec, image, batch)
        print(f"{label}: {work / 1e9:.3f} GFLOP per step; load average {os.getloadavg()[0]:.2f}")
        for name, t in times.items():
            print(f"  {name:24s} {t * 1e3:9.2f} ms  {t / best:6.2f}x the best peer  "
                  f"{work / t / 1e9:7.1f} GFLOP/s  {work / t / 1e9 / peak:6.1%} of peak")
        results[label] = {"median_s": times, "gflop": work / 1e9, "load": os.getloadavg()[0]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cpu": cpu_model(), "threads": threads, "fma_peak_gflops": peak,
                                         "points": results}, indent=2))


if __name__ == "__main__":
    main()
