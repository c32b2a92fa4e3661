"""Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
counter-based generator PyTorch's CUDA and JAX offer: ten rounds of two 32x32->64-bit
products and xors turn a 128-bit counter and a 64-bit key into 128 random bits.

The NumPy reference of the ``dropout`` op. Its compiled lowering (``mlir_nn.codegen.philox``)
does the same integer arithmetic, so masks are bit-identical on every backend.

The seed and the call's offset reach a compiled step as run-time scalars of the step's
dtype: 16-bit chunks (exact in float32), ``KEY_CHUNKS`` for the 64-bit key and
``OFFSET_CHUNKS`` for the 48-bit offset.
"""

from __future__ import annotations

import numpy as np

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
MASK32 = 0xFFFFFFFF
CHUNK = 1 << 16
KEY_CHUNKS = 4
OFFSET_CHUNKS = 3


def philox4x32(counter: tuple[np.ndarray, ...], key: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """The four 32-bit output words (uint64 arrays) for counter words ``counter`` (four arrays or
    ints, each below 2**32) under ``key`` (two ints below 2**32)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = int(key[0]), int(key[1])
    m0, m1 = np.uint64(MULTIPLIERS[0]), np.uint64(MULTIPLIERS[1])
    mask = np.uint64(MASK32)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + WEYL[0]) & MASK32, (k1 + WEYL[1]) & MASK32
        p0, p1 = c0 * m0, c2 * m1  # exact: both factors are below 2**32
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & mask,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & mask)
    return c0, c1, c2, c3


def chunks(value: int, count: int) -> list[int]:
    """``value`` as ``count`` 16-bit chunks, least significant first."""
    return [(value >> (16 * i)) & (CHUNK - 1) for i in range(count)]


def from_chunks(values: list[float] | list[np.ndarray]) -> int:
    """The integer held by 16-bit chunks; each chunk is taken as int(v) mod 2**16 (so any values
    give one well-defined key or offset, the same as the compiled code's)."""
    return sum((int(v) & (CHUNK - 1)) << (16 * i) for i, v in enumerate(values))


def keep_threshold(p: float) -> int:
    """An element is kept when its 32-bit draw is at least this (probability 1 - p)."""
    return int(np.ceil(p * 2.0**32))


def keep_mask(shape: tuple[int, ...], key: int, offset: int, p: float) -> np.ndarray:
    """Booleans of ``shape``: element i (row-major) is kept when word 0 of
    philox4x32((i mod 2**32, i // 2**32, offset mod 2**32, offset // 2**32), key) >= keep_threshold(p)."""
    index = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64)
    counter = (index & np.uint64(MASK32), index >> np.uint64(32), offset & MASK32, offset >> 32)
    word = philox4x32(counter, (key & MASK32, key >> 32))[0]
    return (word >= np.uint64(keep_threshold(p))).reshape(shape)
