"""The random number generator of ``Dropout``: a Philox-4x32-10 key (the seed) and an offset.

Every dropout draw takes one offset: its mask is Philox at counter (element, offset) under
the key (``mlir_nn.ir.philox``), so a draw depends only on the seed, the offset and the
shape, never on the backend. Eager code reserves an offset per call. A traced step gives
each of its dropout calls a slot and reads the key and a base offset as run-time inputs
(``FedTensor``s, refreshed before every call of the compiled step): each call reserves as
many offsets as the step has slots, so a compiled step draws the same masks as the same
code run eagerly, fresh ones on every call, without recompiling; ``manual_seed`` takes
effect on the next call.

``mlir_nn.manual_seed(s)`` also seeds NumPy's global generator, which draws the initial
weights of the layers, so one call makes a whole program reproducible (as in PyTorch).
"""

from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

from mlir_nn.engine import Tensor, Trace, current_trace
from mlir_nn.ir import philox
from mlir_nn.jit.feeds import FedTensor

SEED_LIMIT = 1 << 64
OFFSET_LIMIT = 1 << (16 * philox.OFFSET_CHUNKS)
DEFAULT_SEED = 67280421310721  # PyTorch's default seed


class Generator:
    """A Philox key and the next free offset."""

    def __init__(self, seed: int = DEFAULT_SEED) -> None:
        self._lock = threading.Lock()
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> Generator:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"manual_seed: seed must be an int, got {type(seed).__name__}")
        with self._lock:
            self.seed, self.offset = int(seed) % SEED_LIMIT, 0  # negative seeds wrap, as PyTorch's
        return self

    def initial_seed(self) -> int:
        return self.seed

    def reserve(self, count: int) -> int:
        """The first of ``count`` consecutive fresh offsets."""
        with self._lock:
            base = self.offset
            self.offset = (self.offset + count) % OFFSET_LIMIT
        return base


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed dropout's generator (offsets restart at 0) and NumPy's global one (initial weights)."""
    default_generator.manual_seed(seed)
    np.random.seed(default_generator.seed % (1 << 32))
    return default_generator


class _StepDraws:
    """The draws of one traced step in one dtype: the fed key and offset chunks, and the slots taken."""

    def __init__(self, generator: Generator, dtype: str) -> None:
        self.generator, self.slots, self.base = generator, 0, 0
        self.key = [FedTensor(functools.partial(self._key_chunk, i), dtype, label=f"rng.key{i}")
                    for i in range(philox.KEY_CHUNKS)]
        self.offset = [FedTensor(functools.partial(self._offset_chunk, i), dtype, label=f"rng.offset{i}")
                       for i in range(philox.OFFSET_CHUNKS)]

    def _key_chunk(self, i: int) -> float:
        return float(philox.chunks(self.generator.seed, philox.KEY_CHUNKS)[i])

    def _offset_chunk(self, i: int) -> float:
        """Chunk 0 is refreshed first before every call (captured first): it reserves the call's offsets."""
        if i == 0:
            self.base = self.generator.reserve(self.slots)
        return float(philox.chunks(self.base, philox.OFFSET_CHUNKS)[i])


_DRAWS: weakref.WeakKeyDictionary[Trace, dict[str, _StepDraws]] = weakref.WeakKeyDictionary()


def draw_inputs(dtype: str) -> tuple[list[Tensor], int]:
    """The key and offset chunks (0-d tensors of ``dtype``) and the slot for one dropout draw."""
    generator = default_generator
    trace = current_trace()
    if trace is None:
        offset = generator.reserve(1)
        values = philox.chunks(generator.seed, philox.KEY_CHUNKS) + philox.chunks(offset, philox.OFFSET_CHUNKS)
        return [Tensor(np.array(v, dtype=dtype)) for v in values], 0
    per_dtype = _DRAWS.setdefault(trace, {})
    draws = per_dtype.get(dtype)
    if draws is None:
        draws = per_dtype[dtype] = _StepDraws(generator, dtype)
    slot = draws.slots
    draws.slots += 1
    return draws.key + draws.offset, slot
