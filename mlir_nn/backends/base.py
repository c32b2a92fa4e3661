"""What every backend shares: the executable and backend protocols (arguments are checked
by ``mlir_nn.ir.arguments``)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from mlir_nn.ir import Graph


class Executable(Protocol):
    """A compiled step. ``run`` returns the outputs and updates ``params`` in place."""

    graph: Graph

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]: ...


class Backend(Protocol):
    name: str

    def compile(self, graph: Graph) -> Executable: ...
