"""Data-parallel training over MPI, in Horovod's shape.

Every rank runs the same compiled step on its share of each batch;
``DistributedOptimizer`` puts an ``allreduce_mean`` of every gradient into the traced
step, so all ranks apply the same averaged update::

    from mlir_nn import distributed as dist
    dist.init()
    model = MLP(2, [16, 1])
    dist.broadcast_parameters(model.parameters())   # start from rank 0's weights
    opt = dist.DistributedOptimizer(SGD(model.parameters(), lr=0.1))
    step = mlir_nn.jit(train_step(model, opt))
    step(x[dist.rank()::dist.size()], y[dist.rank()::dist.size()])

Launch with ``mpiexec -n N python script.py``; needs the ``dist`` extra (mpi4py, MPICH).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from mlir_nn.distributed.comm import (
    DistributedError,
    DistributedTimeout,
    allgather,
    init,
    is_initialized,
    rank,
    sample_weight,
    size,
)
from mlir_nn.distributed.optimizer import DistributedOptimizer


def broadcast_parameters(params: Iterable[Any], root: int = 0) -> None:
    """Overwrite every parameter (Tensors or numpy arrays) with the root rank's values, in place."""
    from mlir_nn.distributed.comm import broadcast, require_init
    from mlir_nn.engine import Tensor

    require_init("broadcast_parameters")
    if not 0 <= root < size():
        raise ValueError(f"broadcast_parameters: root {root} is not a rank of this world of {size()}")
    arrays = [p.data if isinstance(p, Tensor) else p for p in params]
    for a in arrays:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"broadcast_parameters: expected Tensors or numpy arrays, got {type(a).__name__}")
    layouts = allgather([(a.shape, a.dtype.name) for a in arrays])
    differing = [r for r, layout in enumerate(layouts) if layout != layouts[root]]
    if differing:
        raise DistributedError(f"broadcast_parameters: ranks {differing} hold parameters of other shapes or "
                               f"dtypes than rank {root}: {layouts[differing[0]]} vs {layouts[root]}")
    for a in arrays:
        broadcast(a, root)


__all__ = [
    "DistributedError", "DistributedOptimizer", "DistributedTimeout", "allgather", "broadcast_parameters",
    "init", "is_initialized", "rank", "sample_weight", "size",
]
