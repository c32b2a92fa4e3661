"""Memref descriptors for every argument of a compiled step, built once and patched per call.

MLIR's packed C interface takes ``void **args`` with ``args[i]`` pointing at a pointer
to the i-th memref descriptor ``{T *allocated, T *aligned, int64 offset,
int64 sizes[rank], int64 strides[rank]}`` (all 8-byte words). All descriptors live in
one int64 numpy array, so binding an array is a few integer stores and a call is a
single native call with a prebuilt address (``thin_call`` writes the same words from C).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides in elements."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


class ArgumentBlock:
    """Descriptors for arguments of the given ranks, in call order."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = list(ranks)
        self.offsets = np.cumsum([0] + [3 + 2 * r for r in self.ranks])[:-1].tolist()
        self.words = np.zeros(sum(3 + 2 * r for r in self.ranks), np.int64)
        base = self.words.ctypes.data
        self.cells = np.array([base + 8 * o for o in self.offsets], np.uint64)  # cells[i] = &descriptor i
        self.packed = self.cells.ctypes.data + 8 * np.arange(len(self.ranks), dtype=np.uint64)  # &cells[i]
        self.address = self.packed.ctypes.data

    def bind(self, i: int, array: np.ndarray) -> None:
        """Point descriptor ``i`` at a C-contiguous ``array`` (sizes and strides from it)."""
        o, r = self.offsets[i], self.ranks[i]
        ptr = array.ctypes.data
        self.words[o:o + 3 + 2 * r] = (ptr, ptr, 0, *array.shape, *contiguous_strides(array.shape))

    def set_batch_major_layout(self, i: int, inner: Sequence[int]) -> None:
        """Sizes and strides of an (N, *inner) argument; ``bind_batch_major`` then sets N."""
        o, r = self.offsets[i], self.ranks[i]
        self.words[o + 3:o + 3 + 2 * r] = (0, *inner, *contiguous_strides((1, *inner)))

    def set_static_layout(self, i: int, shape: Sequence[int]) -> None:
        """Sizes and strides of a fixed-shape argument; then only its pointer changes per call."""
        o, r = self.offsets[i], self.ranks[i]
        self.words[o + 2:o + 3 + 2 * r] = (0, *shape, *contiguous_strides(shape))

    def bind_batch_major(self, i: int, pointer: int, batch: int) -> None:
        """Fast path for an (N, *inner) array after ``set_batch_major_layout``: pointer and N."""
        o = self.offsets[i]
        words = self.words
        words[o] = pointer
        words[o + 1] = pointer
        words[o + 3] = batch

    def descriptor(self, i: int) -> np.ndarray:
        """The words of descriptor ``i`` (for tests and debugging)."""
        o, r = self.offsets[i], self.ranks[i]
        return self.words[o:o + 3 + 2 * r]
