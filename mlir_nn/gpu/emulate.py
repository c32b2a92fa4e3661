"""Run the CUDA pipeline's scheduled IR on the CPU, to check fusion and tiling without a GPU.

``schedule_module`` leaves the step as loops over buffers: ``scf.parallel`` block loops,
``scf.forall`` thread loops (mapped to ``#gpu.thread`` later), shared-memory tiles in the
workgroup address space and the linalg ops of every tile. Run one after the other,
those loops compute exactly what the kernels compute on the device, barriers included:
a barrier follows every thread loop once it is mapped, and sibling thread loops run here
in program order. So this catches wrong tile sizes, fusion, promotion and the epilogue
reading the accumulator; what it cannot see is the mapping to threads itself (checked by
the PTX ABI and launch tests) and anything only the device does.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from mlir.ir import Context, Module, UnitAttr
from mlir.passmanager import PassManager

from mlir_nn.backends.memref_args import ArgumentBlock
from mlir_nn.backends.native import jit
from mlir_nn.gpu.compiler import _find_func, schedule_module

CPU_LOWERING = (
    "buffer-results-to-out-params{modify-public-functions hoist-dynamic-allocs}",
    "scf-forall-to-for", "convert-linalg-to-loops", "lower-affine", "convert-scf-to-cf", "expand-strided-metadata",
    "lower-affine",
    "finalize-memref-to-llvm", "convert-math-to-llvm", "convert-math-to-libm",  # erf: libm's, as the cpu pipeline
    "convert-arith-to-llvm", "convert-cf-to-llvm", "convert-func-to-llvm", "convert-index-to-llvm",
    "convert-ub-to-llvm", "reconcile-unrealized-casts",
)
WORKGROUP = re.compile(r",\s*#gpu\.address_space<(workgroup|private)>")


def scheduled_text(text: str, func: str | None = None) -> str:
    """The step after fusion, bufferization and the tiling schedules (see the module docstring)."""
    with Context():
        module, _ = schedule_module(Module.parse(text), func, {}, register_tiles=False)
        return str(module)


class EmulatedStep:
    """The scheduled step JIT-compiled for the CPU; ``run`` mirrors ``Executable.run`` without in-place updates."""

    def __init__(self, text: str, func: str, result_ranks: list[int]) -> None:
        self.func = func
        self.context = Context()
        with self.context:
            # Shared memory is ordinary memory on the CPU.
            module = Module.parse(WORKGROUP.sub("", scheduled_text(text, func)))
            step = _find_func(module, func)
            step.attributes["llvm.emit_c_interface"] = UnitAttr.get()
            self.arg_ranks = [len(a.type.shape) for a in step.regions[0].blocks[0].arguments]
            PassManager.parse("builtin.module(" + ",".join(CPU_LOWERING) + ")").run(module.operation)
            self.native, self.engine = jit(module, func)
        self.result_ranks = result_ranks
        self.block = ArgumentBlock(self.arg_ranks + result_ranks)
        self.call = self.native.call

    def run(self, args: list[np.ndarray], result_shapes: list[tuple[int, ...]], dtype: Any) -> list[np.ndarray]:
        """Call the step on ``args`` (inputs then parameters); returns fresh result arrays."""
        keep = [np.require(a, dtype, "C") for a in args]  # (ascontiguousarray would make 0-d arrays 1-d)
        results = [np.full(shape, np.nan, dtype) for shape in result_shapes]
        for i, a in enumerate(keep + results):
            self.block.bind(i, a)
        self.call(self.block.address)
        return results
