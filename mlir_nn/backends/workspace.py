"""Workspaces of a compiled CPU step: one numpy buffer per batch size, allocated once (no MLIR import).

A workspace holds the step's intermediates, laid out by its memory plan
(``mlir_nn.backends.memory_plan``). Allocating it here, in Python, turns an impossible
batch into a ``MemoryError`` before native code runs; keeping it makes every later step
of that batch size one without malloc and without fresh pages to fault in. The step's
outputs are not in it: each call writes them into fresh arrays allocated before it runs
and hands those to the caller (no copy out of the workspace).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mlir_nn.ir.shapes import Shape, resolve
from mlir_nn.support.pages import zeroed_bytes

KEEP = 4  # workspaces kept per step (the most recently used batch sizes)
# bytes before the first buffer, one cache line: the status word, the input check's task slots
# (``input_guard``) and the team choice
HEADER = 64
# the task runtime's measurements of which team width runs this batch size's calls faster
# (``task_runtime.c``: TeamChoice), zeroed with the workspace
CHOICE_OFFSET, CHOICE_BYTES = 16, 48
assert CHOICE_OFFSET + CHOICE_BYTES <= HEADER
ALIGN = 64  # every buffer starts on a cache line


@dataclass(frozen=True)
class MemoryPlan:
    """Workspace bytes per power of the batch size, and what stayed on the heap."""

    group_bytes: tuple[int, ...]  # group_bytes[k]: bytes of buffers with k batch-sized dims, per batch**k
    buffers: int  # allocations placed in the workspace
    heap_buffers: int  # allocations left to malloc (nested in loops, or sizes not bounded linearly)
    linear_fixed: int = 0  # bytes of the batch**1 group that do not scale (packed products' padding)

    def workspace_bytes(self, batch: int) -> int:
        """Bytes of the workspace for ``batch`` rows (Python ints: no overflow)."""
        return HEADER + self.linear_fixed + sum(size * batch**k for k, size in enumerate(self.group_bytes))

    def to_json(self) -> dict:
        return {"group_bytes": list(self.group_bytes), "buffers": self.buffers, "heap_buffers": self.heap_buffers,
                "linear_fixed": self.linear_fixed}

    @classmethod
    def from_json(cls, data: dict) -> MemoryPlan:
        return cls(tuple(int(b) for b in data["group_bytes"]), int(data["buffers"]), int(data["heap_buffers"]),
                   int(data["linear_fixed"]))


def round_up(n: int) -> int:
    """``n`` rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Workspace:
    """An ``ALIGN``-aligned byte buffer for the plan, and the outputs' shapes at its batch size."""

    buffer: np.ndarray  # uint8, the plan's bytes (status word first)
    outputs: tuple[tuple[tuple[int, ...], np.dtype], ...]  # (shape, dtype) of each output of the step
    status: memoryview  # the status word as one int32 (item reads ~3x faster than numpy's)
    step_name: str

    def fresh_outputs(self) -> list[np.ndarray]:
        """Uninitialized arrays for one call's outputs (the step writes every element)."""
        try:
            return [np.empty(shape, dtype) for shape, dtype in self.outputs]
        except MemoryError:
            shapes = ", ".join(str(shape) for shape, _ in self.outputs)
            raise MemoryError(f"{self.step_name}: its outputs {shapes} cannot be allocated") from None


class Workspaces:
    """The workspaces of one step, by batch size, least recently used dropped first."""

    def __init__(self, plan: MemoryPlan, outputs: Sequence[tuple[Shape, np.dtype]], step_name: str) -> None:
        self.plan = plan
        self.outputs = list(outputs)
        self.step_name = step_name
        self._by_batch: OrderedDict[int, Workspace] = OrderedDict()

    def get(self, batch: int) -> tuple[Workspace, bool]:
        """The workspace for ``batch`` rows, and whether it was allocated just now."""
        workspace = self._by_batch.get(batch)
        if workspace is not None:
            self._by_batch.move_to_end(batch)
            return workspace, False
        workspace = self._allocate(batch)
        self._by_batch[batch] = workspace
        while len(self._by_batch) > KEEP:
            self._by_batch.popitem(last=False)
        return workspace, True

    def peek(self, batch: int) -> Workspace | None:
        """The workspace for ``batch`` rows if one is kept (its use unrecorded)."""
        return self._by_batch.get(batch)

    def _allocate(self, batch: int) -> Workspace:
        size = round_up(self.plan.workspace_bytes(batch))
        try:
            raw = zeroed_bytes(size + ALIGN)  # large ones on small pages: faulted in faster
        except (MemoryError, ValueError):  # ValueError: larger than the address space
            raise MemoryError(f"{self.step_name}: a batch of {batch} rows needs a workspace of "
                              f"{size / 2**20:,.1f} MiB for its intermediates, which cannot be allocated; "
                              "use smaller batches") from None
        start = -raw.ctypes.data % ALIGN
        buffer = raw[start:start + size]
        outputs = tuple((tuple(resolve(shape, batch)), dtype) for shape, dtype in self.outputs)
        return Workspace(buffer, outputs, memoryview(buffer[:4]).cast("i"), self.step_name)
