"""Compiler side of the CUDA backend: linalg on tensors -> GPU kernels -> PTX/cubin + plan.

Needs the MLIR bindings. What runs the result (``mlir_nn.runtime``) does not.
"""

from mlir_nn.gpu.compiler import ARCH_FEATURES, DEFAULT_ARCH, GpuProgram, compile_linalg

__all__ = ["ARCH_FEATURES", "DEFAULT_ARCH", "GpuProgram", "compile_linalg"]
