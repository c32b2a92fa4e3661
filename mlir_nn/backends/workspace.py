"""Workspaces of a compiled CPU step: one numpy buffer per batch size, allocated once.

The step's intermediates live in the workspace its memory plan sizes
(``mlir_nn.backends.memory_plan``). Allocating it here, in Python, turns an impossible
batch into a ``MemoryError`` before native code runs; keeping it turns every later step
of that batch size into one without malloc and without fresh pages to fault in.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mlir_nn.backends.memory_plan import ALIGN, MemoryPlan

KEEP = 4  # workspaces kept per step (the most recently used batch sizes)


class Workspaces:
    """The workspaces of one step, by batch size, least recently used dropped first."""

    def __init__(self, plan: MemoryPlan, step_name: str) -> None:
        self.plan = plan
        self.step_name = step_name
        self._by_batch: OrderedDict[int, np.ndarray] = OrderedDict()

    def get(self, batch: int) -> np.ndarray:
        """The ``ALIGN``-aligned uint8 workspace for ``batch`` rows."""
        workspace = self._by_batch.get(batch)
        if workspace is None:
            workspace = self._allocate(batch)
            self._by_batch[batch] = workspace
            while len(self._by_batch) > KEEP:
                self._by_batch.popitem(last=False)
        else:
            self._by_batch.move_to_end(batch)
        return workspace

    def _allocate(self, batch: int) -> np.ndarray:
        size = self.plan.workspace_bytes(batch)
        try:
            raw = np.empty(size + ALIGN, np.uint8)
        except (MemoryError, ValueError):  # ValueError: larger than the address space
            raise MemoryError(f"{self.step_name}: a batch of {batch} rows needs a workspace of "
                              f"{size / 2**20:,.1f} MiB for its intermediates, which cannot be allocated; "
                              "use smaller batches") from None
        start = -raw.ctypes.data % ALIGN
        return raw[start:start + size]
