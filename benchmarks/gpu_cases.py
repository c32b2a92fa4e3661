"""The cases of the GPU check, shared by the compile side and the GPU side.

A case is a step function over an MLP or one op, with its parameters and the batch sizes
it is checked at. Inputs are drawn from a seeded generator, so both sides see the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CASES: dict[str, dict[str, Any]] = {
    "moons_step": {"kind": "mlp_step", "sizes": [2, 32, 32, 16, 1], "lr": 0.005, "batches": [10, 7]},
    "mlp_step": {"kind": "mlp_step", "sizes": [784, 1024, 1024, 10], "lr": 0.01, "batches": [512, 3]},
    "op_matmul": {"kind": "op", "op": "matmul", "sizes": [784, 1024], "batches": [512, 5]},
    "op_linear_relu": {"kind": "op", "op": "linear_relu", "sizes": [784, 1024], "batches": [512, 1]},
    "op_mse": {"kind": "op", "op": "mse", "sizes": [10], "batches": [512, 1]},
    # LeNet-5 (two 5x5 convolutions with ReLU and 2x2 max pooling, three linear layers), MSE on 10 outputs
    "lenet_step": {"kind": "cnn_step", "model": "lenet", "sizes": [1, 28, 28, 10], "lr": 0.01, "batches": [64, 5]},
    # VGG-style: three 3x3 convolutions (32, 64, 128 channels) with ReLU and 2x2 max pooling, a linear layer
    "vgg_step": {"kind": "cnn_step", "model": "vgg_small", "sizes": [3, 32, 32, 10], "lr": 0.01, "batches": [128, 3]},
    # the char GPT's default (examples/char_gpt.py): token and position embeddings, 2 pre-LayerNorm blocks of
    # 4-head causal self-attention and a GELU MLP, width 64, context 64, cross-entropy over every position, Adam;
    # traced at static shapes (sizes: vocabulary, context, layers, heads, width)
    "gpt_step": {"kind": "gpt_step", "sizes": [96, 64, 2, 4, 64], "lr": 1e-3, "batches": [32], "static": True},
}
SAMPLE = 4096  # updated parameters larger than this are checked at SAMPLE fixed positions


def inputs_for(case: dict[str, Any], batch: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + batch)
    sizes = case["sizes"]
    if case["kind"] == "mlp_step":
        return [rng.standard_normal((batch, sizes[0]), dtype=np.float32),
                rng.standard_normal((batch, sizes[-1]), dtype=np.float32)]
    if case["kind"] == "cnn_step":
        return [rng.standard_normal((batch, *sizes[:3]), dtype=np.float32),
                rng.standard_normal((batch, sizes[3]), dtype=np.float32)]
    if case["kind"] == "gpt_step":  # token indices and next-token targets (as float32, as the step takes them)
        return [rng.integers(0, sizes[0], (batch, sizes[1])).astype(np.float32) for _ in range(2)]
    if case["op"] == "mse":
        return [rng.standard_normal((batch, sizes[0]), dtype=np.float32) for _ in range(2)]
    return [rng.standard_normal((batch, sizes[0]), dtype=np.float32)]


def sample_positions(size: int) -> np.ndarray:
    return np.random.default_rng(size).choice(size, SAMPLE, replace=False) if size > SAMPLE else np.arange(size)


def lenet(nn: Any, classes: int) -> Any:
    """LeNet-5 from a module library with PyTorch's layer names (mlir_nn.nn or torch.nn)."""
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, classes))


def vgg_small(nn: Any, classes: int) -> Any:
    """The small VGG-style net of the CNN step benchmark, for 3x32x32 images."""
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(2048, classes))


def gpt(nn: Any, case: dict[str, Any]) -> Any:
    """The case's GPT from mlir_nn.nn."""
    vocab, context, layers, heads, width = case["sizes"]
    return nn.GPT(vocab, context, n_layer=layers, n_head=heads, n_embd=width)


def cnn(nn: Any, case: dict[str, Any]) -> Any:
    """The case's convolutional model from a module library (mlir_nn.nn or torch.nn)."""
    return {"lenet": lenet, "vgg_small": vgg_small}[case["model"]](nn, case["sizes"][3])


# The resident-training check: a Trainer on the moons MLP with momentum and validation, traced
# identically where its artifacts are compiled and on the GPU machine (which finds them in the
# cache folder the artifacts carry, so it needs neither MLIR nor egglog).
TRAINER_CASE = {"sizes": [2, 32, 32, 16, 1], "lr": 0.005, "momentum": 0.9, "samples": 197, "validation": 50,
                "batch_size": 10, "epochs": 4}  # 197 samples: batches of 10 and a last one of 7


def trainer_case(backend: str) -> tuple[Any, Any, Any, tuple[np.ndarray, ...]]:
    """(trainer, model, optimizer, (X, y, X_val, y_val)) of the resident-training check."""
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import Trainer

    case = TRAINER_CASE
    np.random.seed(0)
    model = MLP(case["sizes"][0], case["sizes"][1:])
    opt = SGD(model.parameters(), lr=case["lr"], momentum=case["momentum"])
    rng = np.random.default_rng(1)
    X = rng.standard_normal((case["samples"] + case["validation"], case["sizes"][0]))
    y = (X[:, 0] * X[:, 1] > 0).astype(np.int64)
    n = case["samples"]
    return Trainer(model, opt, backend=backend), model, opt, (X[:n], y[:n], X[n:], y[n:])


def trainer_steps(trainer: Any) -> list[Any]:
    """The compiled steps a trained Trainer holds: its training step(s), then the forward step."""
    functions = [*trainer._steps.values(), trainer._forward]
    return [compiled for function in functions for compiled in function._cache.values()]
