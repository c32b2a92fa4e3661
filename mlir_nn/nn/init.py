"""PyTorch's default initializations, drawn from NumPy's global generator (``np.random.seed``)."""

from __future__ import annotations

import math

import numpy as np


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    """Uniform in (-bound, bound)."""
    return np.random.uniform(-bound, bound, size=shape)


def fan_in_bound(fan_in: int) -> float:
    """1/sqrt(fan_in): the bound of ``nn.Linear``'s weights (Kaiming-uniform with a=sqrt(5)) and biases."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
