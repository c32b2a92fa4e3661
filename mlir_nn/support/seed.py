"""``mlir_nn.manual_seed``: one call makes initialization reproducible (NumPy's global RNG,
which layers draw their initial weights from)."""

from __future__ import annotations

import numpy as np


def manual_seed(seed: int) -> None:
    """Seed the random numbers mlir-nn draws (initial weights), as PyTorch's ``manual_seed``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"manual_seed: seed must be an integer in [0, 2**32), got {seed!r}")
    np.random.seed(int(seed))
