"""Whether this machine can run CUDA steps, for the tests that need a GPU."""

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


needs_gpu = pytest.mark.skipif(not has_gpu(), reason="needs an NVIDIA GPU and cuda-bindings "
                                                       "(run benchmarks/gpu_check.py there)")
