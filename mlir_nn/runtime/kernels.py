"""ctypes wrapper of the hand-written CUDA kernels (``libmlirnn_kernels.so`` built by CMake).

A benchmark baseline only: every function takes device pointers (ints) and sizes and
launches on the default stream. ``load()`` finds the library at ``$MLIRNN_KERNELS_LIB``
or ``build/kernels/libmlirnn_kernels.so`` under the repository.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

DEFAULT_LIB = Path(__file__).resolve().parents[2] / "build" / "kernels" / "libmlirnn_kernels.so"
PTR, INT, FLT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    "mlirnn_matmul_naive": [PTR, PTR, PTR, INT, INT, INT, PTR],
    "mlirnn_matmul_tiled": [PTR, PTR, PTR, INT, INT, INT, PTR],
    "mlirnn_bias_add": [PTR, PTR, PTR, INT, INT, PTR],
    "mlirnn_relu": [PTR, PTR, INT, PTR],
    "mlirnn_relu_grad": [PTR, PTR, PTR, INT, PTR],
    "mlirnn_mse": [PTR, PTR, PTR, INT, PTR],
    "mlirnn_mse_grad": [PTR, PTR, PTR, INT, PTR],
    "mlirnn_sgd_update": [PTR, PTR, FLT, INT, PTR],
    "mlirnn_synchronize": [],
}


class ReferenceKernels:
    """The library's entry points as methods; a non-zero CUDA status raises RuntimeError."""

    def __init__(self, path: str | Path | None = None) -> None:
        path = Path(path or os.environ.get("MLIRNN_KERNELS_LIB") or DEFAULT_LIB)
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; build it with: cmake -S . -B build/kernels && "
                                    "cmake --build build/kernels")
        self.lib = ctypes.CDLL(str(path))
        for name, argtypes in SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def __getattr__(self, name: str):
        fn = getattr(self.lib, f"mlirnn_{name}")

        def call(*args: int | float) -> None:
            status = fn(*args, None) if name != "synchronize" else fn()
            if status:
                raise RuntimeError(f"reference kernel {name} failed with CUDA error {status}")

        return call
