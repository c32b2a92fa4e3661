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
}
SAMPLE = 4096  # updated parameters larger than this are checked at SAMPLE fixed positions


def inputs_for(case: dict[str, Any], batch: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + batch)
    sizes = case["sizes"]
    if case["kind"] == "mlp_step":
        return [rng.standard_normal((batch, sizes[0]), dtype=np.float32),
                rng.standard_normal((batch, sizes[-1]), dtype=np.float32)]
    if case["op"] == "mse":
        return [rng.standard_normal((batch, sizes[0]), dtype=np.float32) for _ in range(2)]
    return [rng.standard_normal((batch, sizes[0]), dtype=np.float32)]


def sample_positions(size: int) -> np.ndarray:
    return np.random.default_rng(size).choice(size, SAMPLE, replace=False) if size > SAMPLE else np.arange(size)
