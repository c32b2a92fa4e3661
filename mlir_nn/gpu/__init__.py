"""Compiler side of the CUDA backend: linalg on tensors -> GPU kernels -> PTX/cubin + plan.

Needs the MLIR bindings. What runs the result (``mlir_nn.runtime``) does not.

How an op of the tensor IR reaches the GPU: its shared linalg lowering (``mlir_nn.codegen``)
is all the CUDA path needs. float32 products with their fill and element-wise epilogue
become register-tiled kernels (``matmul``: 128x128 or 64x64 block tiles chosen per shape,
operand tiles by ``cp.async`` or 128-bit loads into double-buffered shared memory), sums
over the batch into a fixed number of outputs two-kernel reductions (``reduction``), every
other linalg op is tiled over its parallel loops (``schedule``) with any reduction loop
kept inside a thread, and an op with no parallel loop runs in one thread. All kernels of a
step land in one ``gpu.module`` named after the Graph ops (``modules``). A new op whose
body uses an arith or math op the SIMT interpreter (``simt``) does not know yet needs one
line there (``BINARY``/``UNARY``), so ``mlir-nn compile --target cuda --simt-check`` keeps
covering it.
"""

from mlir_nn.gpu.compiler import ARCH_FEATURES, DEFAULT_ARCH, GpuProgram, compile_linalg

__all__ = ["ARCH_FEATURES", "DEFAULT_ARCH", "GpuProgram", "compile_linalg"]
