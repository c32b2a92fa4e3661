"""Compiled steps: the tracing driver (``function``), the compile pipeline (``pipeline``),
its tiers (``tiered``), and what a compiled step checks and refreshes around each call
(``guards``, ``feeds``)."""

from mlir_nn.jit.function import DEFAULT_BACKEND, JitFunction, jit
from mlir_nn.jit.pipeline import StepPipeline
from mlir_nn.jit.step import CompiledStep
from mlir_nn.jit.trace import trace_step

__all__ = ["DEFAULT_BACKEND", "CompiledStep", "JitFunction", "StepPipeline", "jit", "trace_step"]
