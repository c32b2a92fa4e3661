"""``DistributedOptimizer``: any optimizer, with gradients averaged over the ranks first."""

from __future__ import annotations

from typing import Any

from mlir_nn.distributed.comm import require_init
from mlir_nn.engine import apply


class DistributedOptimizer:
    """Wraps an optimizer (Horovod's shape): ``step()`` replaces each gradient by its
    ``allreduce_mean`` over the ranks, then runs the wrapped optimizer's own ``step()``.

    Traced by ``mlir_nn.jit``, the reduction is an op of the step's graph; eagerly, it runs
    at once. Every other attribute (``lr``, ``state``, ``parameters``, ``zero_grad``, ...)
    is the wrapped optimizer's, read and written through this object.
    """

    def __init__(self, optimizer: Any) -> None:
        require_init("DistributedOptimizer")
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("DistributedOptimizer: the optimizer is already distributed")
        if not callable(getattr(optimizer, "step", None)) or not hasattr(optimizer, "parameters"):
            raise TypeError(f"DistributedOptimizer: expected an optimizer with parameters and step(), "
                            f"got {type(optimizer).__name__}")
        object.__setattr__(self, "optimizer", optimizer)

    def step(self) -> None:
        """Average the gradients over the ranks (they stay averaged in ``.grad``), then update."""
        for p in self.optimizer.parameters:
            if p._grad is not None:
                p._grad = apply("allreduce_mean", p._grad)
        self.optimizer.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.optimizer, name, value)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"
