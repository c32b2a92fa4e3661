"""One traced signature of a step function and the code that runs it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from mlir_nn.backends import Executable, gemm
from mlir_nn.backends.buffered import BufferedExecutable
from mlir_nn.backends.thread_pool import available_cores
from mlir_nn.engine import Tensor
from mlir_nn.ir import BATCH, Graph
from mlir_nn.ir.sequence_ops import check_indices
from mlir_nn.jit import blas_threads
from mlir_nn.jit.feeds import FedTensor
from mlir_nn.jit.pipeline import Built, StepPipeline
from mlir_nn.jit.tiered import BackgroundCompile, running

if TYPE_CHECKING:
    from mlir_nn.backends.cpu import PlainCall

DATA_ATTRIBUTE = "_data"  # where a Tensor keeps its array (what Tensor.data returns)


class CompiledStep:
    """One traced and compiled signature of a step; ``stages`` holds each stage's text.

    ``graph`` is the traced step; ``optimized_graph`` is what the backend runs (the
    e-graph optimizer's result, or the traced graph when optimizing is off or failed;
    ``optimize_report`` says which and why).
    """

    def __init__(self, graph: Graph, captured: list[Tensor], single: bool, pipeline: StepPipeline,
                 batch_estimate: int | None = None) -> None:
        self.graph = graph
        self.captured = captured
        self.single = single
        self.pipeline = pipeline
        self.feeds = [t for t in captured if isinstance(t, FedTensor)]
        self.index_inputs = index_inputs(graph)
        self.min_batch = min_batch(graph)
        self._batch_estimate = batch_estimate
        self._background: BackgroundCompile | None = None
        self._switch = threading.Lock()
        self.first_tier = pipeline.first_tier
        tiers = pipeline.tiers(graph)
        built = pipeline.cached(graph, batch_estimate) if tiers else None
        pipeline.check(compiling=built is None)
        if built is not None:
            self._use(built)
        elif tiers:  # see mlir_nn.jit.tiered
            if self.first_tier == "native":  # compiled first, so that its compile has this machine's cores
                self._use(pipeline.quick(graph))
            else:
                self.optimized_graph, self.optimize_report = graph, None
                self.executable: Executable = BufferedExecutable(graph)
                self.stages: dict[str, str] = {"tensor": str(graph)}
            # the native tier's first call runs on both cores first (``run``), then the process starts
            self._background = BackgroundCompile(graph, batch_estimate, pipeline.optimize,
                                                 held=self.first_tier == "native")
            self.run_plain: PlainCall | None = None  # every call goes through run, which switches tiers
        else:
            self._use(pipeline.build(graph, batch_estimate))

    @property
    def backend(self) -> str:
        return self.pipeline.backend

    def _use(self, built: Built) -> None:
        self.optimized_graph, self.optimize_report, self.executable = built.optimized, built.report, built.executable
        self.stages = {"tensor": str(self.graph), "optimized": str(built.optimized)}
        self.stages.update(getattr(built.executable, "stages", {}))
        plain_entry = getattr(built.executable, "plain_entry", None)
        feeds = [(i, t.source) for i, t in enumerate(self.captured) if isinstance(t, FedTensor)]
        # index inputs and a minimum batch are checked in run
        plain = plain_entry is not None and not self.index_inputs and self.min_batch is None
        self.run_plain = plain_entry(self.captured, DATA_ATTRIBUTE, feeds) if plain else None

    @property
    def tier(self) -> str:
        """What runs the next call: while a tiered compile is pending, ``"numpy"`` (the
        interpreter) or ``"quick"`` (native code of the quick tier); then the backend."""
        if self._background is None:
            return self.backend
        return "quick" if self.first_tier == "native" else "numpy"

    def finish_compile(self, wait: bool = True) -> None:
        """Switch a tiered step to compiled code: when its compile process is done, or (``wait``)
        after waiting for it. A failed background compile is redone here, raising its error."""
        with self._switch:
            background = self._background
            if background is None or not (wait or background.done()):
                return
            background.wait()
            self._use(self.pipeline.build(self.graph, self._batch_estimate, cached=True))
            self._background = None

    def as_text(self, stage: str = "tensor") -> str:
        self.finish_compile()
        try:
            return self.stages[stage]
        except KeyError:
            raise ValueError(f"stage {stage!r} not available; have {', '.join(self.stages)}") from None

    def _param_arrays(self) -> list[np.ndarray]:
        """The captured tensors' arrays, hyperparameter feeds refreshed from their sources first."""
        for t in self.feeds:
            t.refresh()
        return [t.data for t in self.captured]

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs for these input arrays (parameters updated in place)."""
        if self._background is not None:
            self.finish_compile(wait=False)
        for position, op, size in self.index_inputs:
            check_indices(f"{op} (step argument {self.graph.inputs[position].attr('name')})", arrays[position], size)
        if self.min_batch is not None:
            check_min_batch(self.graph, arrays, self.min_batch)
        if self.tier == "numpy":  # the interpreter's products leave the compile processes their cores
            with blas_threads.limited(available_cores() - running()):
                return self.executable.run(arrays, self._param_arrays())
        background = self._background
        if background is not None and background.held:  # the native tier's first call: the compile
            try:  # process starts after it, which meanwhile has the cores its products can take
                with gemm.threads(available_cores() - running()):
                    return self.executable.run(arrays, self._param_arrays())
            finally:
                background.release()
        return self.executable.run(arrays, self._param_arrays())


def index_inputs(graph: Graph) -> list[tuple[int, str, int]]:
    """(argument position, op, axis size) for each step argument that indexes a gather: checked
    before every call, so an out-of-range index is an error naming the op, never a silent zero."""
    positions = {node: i for i, node in enumerate(graph.inputs)}
    found = []
    for node in graph.nodes:
        if node.op in ("take", "gather") and node.inputs[1] in positions:
            found.append((positions[node.inputs[1]], node.op, int(node.inputs[0].shape[node.attr("axis")])))
    return found


def min_batch(graph: Graph) -> int | None:
    """The smallest batch a step with run-time batch statistics can take, or None when any
    batch will do. ``numel`` over the batch is what an unbiased variance divides by less one
    (BatchNorm in training): it needs more than one value per channel, as PyTorch checks."""
    need = None
    for node in graph.nodes:
        if node.op == "numel":
            dims = [node.inputs[0].shape[a] for a in node.attr("axes")]
            if BATCH in dims:
                static = int(np.prod([d for d in dims if d != BATCH], dtype=np.int64))
                need = max(need or 0, -(-2 // static))
    return need if need is not None and need > 1 else None


def check_min_batch(graph: Graph, arrays: list[np.ndarray], need: int) -> None:
    """Raise before anything runs when the batch is smaller than ``need``."""
    batch = next((a.shape[0] for a, node in zip(arrays, graph.inputs) if node.shape and node.shape[0] == BATCH), None)
    if batch is not None and batch < need:
        raise ValueError(f"{graph.name}: batch statistics (BatchNorm in training) need more than 1 value per "
                         f"channel: expected a batch of at least {need}, got {batch}")
