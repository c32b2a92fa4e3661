"""A character-level GPT trained on the help texts of Python's standard library
(``pydoc_data.topics``, shipped with Python): token and position embeddings, two pre-LayerNorm
blocks of causal self-attention (4 heads, width 64) and a GELU MLP, context 64, trained with
AdamW (weight decay on the matrices only, as nanoGPT) and gradient-norm clipping at 1.0, one
compiled step per mini-batch.

Prints the corpus's unigram entropy (the loss of the best model that ignores context) next to
the validation loss, writes output/char_gpt_loss.png and samples text at the end.

    python examples/char_gpt.py [steps]
"""

import argparse
import time
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np

import mlir_nn
from mlir_nn import nn
from mlir_nn.optim import AdamW

BLOCK, BATCH = 64, 32
WEIGHT_DECAY, CLIP = 0.1, 1.0


def corpus() -> tuple[np.ndarray, list[str]]:
    """The topics' text as token ids, and the characters they stand for."""
    text = "\n".join(topics[name] for name in sorted(topics))
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    return np.array([lookup[c] for c in text], dtype=np.int64), chars


def unigram_entropy(ids: np.ndarray, vocab: int) -> float:
    """-sum p log p over character frequencies (nats, as the cross-entropy)."""
    p = np.bincount(ids, minlength=vocab) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def batches(ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, len(ids) - BLOCK - 1, BATCH)
    windows = np.stack([ids[s:s + BLOCK + 1] for s in starts])
    return windows[:, :-1], windows[:, 1:]


def sample(model: nn.GPT, chars: list[str], prompt: str, length: int, rng: np.random.Generator) -> str:
    """Continue ``prompt`` by drawing each next character from the model's softmax (eager)."""
    lookup = {c: i for i, c in enumerate(chars)}
    ids = [lookup[c] for c in prompt]
    model.eval()
    for _ in range(length):
        logits = model(np.array([ids[-BLOCK:]])).data[0, -1].astype(np.float64)
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(chars), p=p / p.sum())))
    return "".join(chars[i] for i in ids)


def plot(losses: list[float], evals: list[tuple[int, float, float]], entropy: float, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(losses, alpha=0.5, label="training (per step)")
    steps, train, val = zip(*evals)
    ax.plot(steps, val, "o-", label="validation")
    ax.axhline(entropy, color="gray", linestyle="--", label=f"unigram entropy {entropy:.2f}")
    ax.set(xlabel="step", ylabel="cross-entropy (nats)", title="Character-level GPT on pydoc_data.topics")
    ax.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main(steps: int = 1000, seed: int = 0, verbose: bool = True) -> float:
    from tqdm import tqdm

    mlir_nn.manual_seed(seed)
    rng = np.random.default_rng(seed)
    ids, chars = corpus()
    split = int(0.9 * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]
    entropy = unigram_entropy(train_ids, len(chars))
    model = nn.GPT(len(chars), BLOCK, n_layer=2, n_head=4, n_embd=64)
    params = list(model.parameters())
    opt = AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
                 {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=2e-3)

    @mlir_nn.jit(dynamic_batch=False, tiered=False)
    def train_step(idx, targets):
        opt.zero_grad()
        loss = model.loss(idx, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        return loss

    def evaluate(data: np.ndarray, count: int = 6) -> float:
        """Mean loss over ``count`` fixed batches (eager: no second step to compile)."""
        model.eval()
        eval_rng = np.random.default_rng(1)
        value = float(np.mean([model.loss(*batches(data, eval_rng)).item() for _ in range(count)]))
        model.train()
        return value

    losses, evals = [], []
    start = time.perf_counter()
    train_step.lower(*batches(train_ids, rng))  # compile before the clock of the bar starts
    print(f"Compiled the training step in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    bar = tqdm(range(steps), desc="Training", unit="step", disable=not verbose)
    for step in bar:
        losses.append(float(train_step(*batches(train_ids, rng))))
        if (step + 1) % 500 == 0 or step + 1 == steps:
            evals.append((step, evaluate(train_ids), evaluate(val_ids)))
            bar.set_postfix(train=f"{evals[-1][1]:.3f}", val=f"{evals[-1][2]:.3f}")
    elapsed = time.perf_counter() - start
    val = evals[-1][2]
    print(f"Trained {steps} steps (batch {BATCH}, context {BLOCK}) in {elapsed:.1f} s on backend 'cpu'")
    print(f"Unigram entropy of the corpus: {entropy:.3f} nats/char")
    print(f"Validation loss: {val:.3f} nats/char (training {evals[-1][1]:.3f})")
    plot(losses, evals, entropy, "output/char_gpt_loss.png")
    print("Wrote output/char_gpt_loss.png")
    print("Sample:\n" + sample(model, chars, "The ", 300, np.random.default_rng(seed)))
    return val


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="?", type=int, default=1000, help="training steps (default 1000)")
    count = parser.parse_args().steps
    if count < 1:
        parser.error(f"steps must be a positive integer, got {count}")
    main(steps=count)
