"""Median time of one training step (forward, backward, Adam) of the character-level GPT of
``examples/char_gpt.py``: token and position embeddings, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, cross-entropy over every position.

Variants, measured round-robin (one short burst each per round, so load changes hit all alike),
reported as medians and as ratios to PyTorch eager:

* ``cpu``: the compiled CPU step (``mlir_nn.jit``, static shapes);
* ``torch``: PyTorch CPU eager (float32, same weights and data), on every core this process
  may use, and ``torch-1-thread`` on one (its threads spin and collapse when the cores are shared);
* ``torch.compile``: the same model through ``torch.compile``, where it compiles here;
* ``jax``: the same model hand-written in ``jax.numpy`` (``benchmarks/gpt_jax.py``), step and Adam jitted.

The cpu variant is also reported against the best of torch.compile and JAX.

    python benchmarks/gpt_step.py [--config small|medium] [--batch 32] [--rounds 7] [--no-torch-compile]
                                  [--no-jax] [--json FILE]

``small`` is the example's default (2 layers, 4 heads, width 64, context 64); ``medium`` has
4 layers and width 128.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {"small": dict(n_layer=2, n_head=4, n_embd=64), "medium": dict(n_layer=4, n_head=4, n_embd=128),
           "tiny": dict(n_layer=1, n_head=2, n_embd=16)}  # tiny: the smoke test's
VOCAB, BLOCK = 96, 64
# pause before each burst: the last contender's threads (PyTorch's, OpenBLAS's) spin on after it and
# take a core from the next one's second thread
SETTLE_S = 0.3


def torch_gpt(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> object:
    """The PyTorch twin of ``mlir_nn.nn.GPT`` (same module names, so state_dicts match)."""
    import torch
    from torch import nn

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc, self.gelu, self.c_proj = nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(n_embd), SelfAttention()
            self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

        def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            logits = self(idx)
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT()


def batch_data(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (batch, BLOCK + 1))
    return tokens[:, :-1], tokens[:, 1:]


def mlir_nn_variant(config: dict, x: np.ndarray, y: np.ndarray) -> tuple[Callable[[], object], dict]:
    import mlir_nn
    from mlir_nn import nn
    from mlir_nn.optim import Adam

    np.random.seed(0)
    model = nn.GPT(VOCAB, BLOCK, **config)
    opt = Adam(model.parameters(), lr=1e-3)

    def step(idx, targets):
        opt.zero_grad()
        loss = model.loss(idx, targets)
        loss.backward()
        opt.step()
        return loss

    compiled = mlir_nn.jit(step, dynamic_batch=False, tiered=False)
    start = time.perf_counter()
    compiled(x, y)
    print(f"mlir-nn compile + first step: {time.perf_counter() - start:.1f} s", flush=True)
    return lambda: compiled(x, y), model.state_dict()


def torch_variants(config: dict, state: dict, x: np.ndarray, y: np.ndarray,
                   compiled: bool) -> dict[str, Callable[[], object]]:
    try:
        import torch
    except ImportError:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    variants = {}
    runs = [("torch", cores), ("torch-1-thread", 1)] + ([("torch.compile", cores)] if compiled else [])
    for name, threads in runs:
        model = torch_gpt(VOCAB, BLOCK, **config)
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_of = torch.compile(model.loss) if name == "torch.compile" else model.loss

        def step(opt=opt, loss_of=loss_of, threads=threads) -> object:
            torch.set_num_threads(threads)
            opt.zero_grad()
            loss = loss_of(xt, yt)
            loss.backward()
            opt.step()
            return loss

        try:
            step()
        except Exception as e:  # noqa: BLE001 - torch.compile needs a C++ toolchain; say why it is left out
            print(f"{name}: left out ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        variants[name] = step
    return variants


def jax_variant(config: dict, state: dict, x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], object]]:
    from benchmarks.gpt_jax import adam_step

    try:
        step = adam_step(state, config["n_layer"], config["n_head"])
    except ImportError:  # JAX is optional
        return {}
    step(x, y)
    return {"jax": lambda: step(x, y)}


def measure(variants: dict[str, Callable[[], object]], rounds: int, burst: int) -> dict[str, float]:
    """Median seconds a step of each variant, round-robin bursts, each after a pause (SETTLE_S)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            for _ in range(burst):
                run()
            times[name].append((time.perf_counter() - start) / burst)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--burst", type=int, default=3)
    parser.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--no-jax", action="store_true", help="leave JAX out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = CONFIGS[args.config]
    x, y = batch_data(args.batch)
    ours, state = mlir_nn_variant(config, x, y)
    variants = {"cpu": ours, **torch_variants(config, state, x, y, not args.no_torch_compile),
                **({} if args.no_jax else jax_variant(config, state, x, y))}
    medians = measure(variants, args.rounds, args.burst)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    cpu = platform.processor() or platform.machine()
    print(f"GPT {args.config} {config}, batch {args.batch}, context {BLOCK}; {cpu}, load {' '.join(load)}")
    base = medians.get("torch")
    for name, t in medians.items():
        ratio = f"  {t / base:.2f}x torch eager" if base else ""
        print(f"  {name:14s} {t * 1e3:8.2f} ms{ratio}")
    rivals = [medians[n] for n in ("torch.compile", "jax") if n in medians]
    if rivals:
        print(f"  cpu / best of torch.compile and JAX: {medians['cpu'] / min(rivals):.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"config": args.config, "batch": args.batch, "load": load,
                                         "median_s": medians}, indent=2))


if __name__ == "__main__":
    main()
