"""The Trainer's side of data parallelism: each rank trains on its share of every batch.

All ranks shuffle with the same random state (rank 0's, sent to the others when training
starts), so they cut the same batches; rank r takes the r-th contiguous share of each.
Gradients are averaged with each rank weighted by its share's size, so the update equals
the single-process update on the whole batch, even when the batch does not divide evenly
(a rank with an empty share runs the step on one sample at weight 0).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from mlir_nn.distributed import comm
from mlir_nn.distributed.optimizer import DistributedOptimizer


def shard_bounds(n: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous share of n items (the first n % size ranks get one more)."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def prepare(model: Any, optimizer: Any) -> DistributedOptimizer:
    """Rank 0's parameters everywhere, and the optimizer wrapped to average gradients."""
    comm.require_init("Trainer(distributed=True)")
    from mlir_nn.distributed import broadcast_parameters

    broadcast_parameters(model.parameters())
    return optimizer if isinstance(optimizer, DistributedOptimizer) else DistributedOptimizer(optimizer)


def check_plan(**plan: Any) -> None:
    """Every rank must train the same way on the same data: compare ``plan`` (sizes, epochs,
    batch size, a digest of the arrays...) across ranks before the first step, and raise the
    same ValueError on every rank, naming what differs, rather than run mismatched collectives."""
    plans = comm.allgather({k: _digest(v) if isinstance(v, np.ndarray) else v for k, v in plan.items()})
    differing = sorted({k for other in plans[1:] for k in plan if other.get(k) != plans[0].get(k)})
    if differing:
        detail = "; ".join(f"{k}: " + ", ".join(f"rank {r} {p[k]!r}" for r, p in enumerate(plans)) for k in differing)
        raise ValueError(f"Trainer(distributed=True): the ranks' training plans differ ({detail}); every rank must "
                         "call train with the same data and settings (each takes its own share of every batch)")


def _digest(array: np.ndarray) -> str:
    """Shape, dtype and a hash of the contents: equal on two ranks iff they hold the same array."""
    contiguous = np.ascontiguousarray(array)
    return f"{contiguous.shape}:{contiguous.dtype}:{hashlib.sha256(contiguous.tobytes()).hexdigest()[:16]}"


def sync_random_state() -> None:
    """Give every rank rank 0's state of Python's and NumPy's global random generators."""
    python_state, numpy_state = comm.allgather((random.getstate(), np.random.get_state()))[0]
    random.setstate(python_state)
    np.random.set_state(numpy_state)


class ShardedStep:
    """Runs ``step(x, y) -> (loss, prediction)`` on this rank's share of the batch and returns
    the whole batch's mean loss and predictions, gathered from all ranks."""

    def __init__(self, step: Callable[[np.ndarray, np.ndarray], tuple[Any, np.ndarray]]) -> None:
        self.step = step

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = shard_bounds(len(x), comm.rank(), comm.size())
        if hi > lo:
            with comm.sample_weight(hi - lo):
                loss, pred = self.step(x[lo:hi], y[lo:hi])
        else:  # nothing to learn from here, but the reduction needs every rank
            with comm.sample_weight(0):
                loss, pred = self.step(x[:1], y[:1])
            pred = pred[:0]
        parts = comm.allgather((hi - lo, float(loss), pred))
        total = sum(count * value for count, value, _ in parts) / len(x)
        return np.asarray(total, pred.dtype), np.concatenate([p for _, _, p in parts])
