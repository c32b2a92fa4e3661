"""Tensors fed from Python state on every call of a compiled step.

A ``FedTensor`` is a 0-d tensor whose value comes from ``source()``, e.g. an optimizer's
current learning rate. A traced step captures it like any other tensor (it becomes a 0-d
parameter of the graph), and ``mlir_nn.jit`` calls ``refresh()`` on it before every call,
so a changed value takes effect on the next call without re-tracing or recompiling.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mlir_nn.engine import Tensor


class FedTensor(Tensor):
    """A 0-d tensor holding ``source()``, re-read by ``refresh()``."""

    def __init__(self, source: Callable[[], float], dtype: str, label: str = "") -> None:
        super().__init__(np.zeros((), dtype), label=label, dtype=dtype)
        self.source = source
        self.refresh()

    def refresh(self) -> None:
        """Write the current value of the source into this tensor's array (in place)."""
        self._data[()] = self.source()  # type: ignore[index]
