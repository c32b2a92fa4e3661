"""Whether this machine can compile and run CUDA steps, for the tests that need a GPU."""

import importlib.util

import pytest


def has_gpu() -> bool:
    """True when cuda-bindings is installed and its driver finds a GPU."""
    if importlib.util.find_spec("cuda") is None:
        return False
    try:
        from mlir_nn.runtime.driver import load_driver

        load_driver()
        return True
    except Exception:
        return False


# These tests compile their steps too, so they need the MLIR bindings beside the GPU. A GPU machine
# without MLIR runs the precompiled checks instead: benchmarks/gpu_check.py.
needs_gpu = pytest.mark.skipif(not (has_gpu() and importlib.util.find_spec("mlir") is not None),
                               reason="needs an NVIDIA GPU, cuda-bindings and the MLIR bindings "
                                      "(a GPU machine without MLIR runs benchmarks/gpu_check.py)")
