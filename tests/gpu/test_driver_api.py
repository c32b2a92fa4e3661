"""runtime/driver.py's calls against the installed cuda-bindings, on a machine without a driver.

cuda-bindings converts a call's arguments before it loads libcuda.so, and without a driver
that load fails with cuda.pathfinder's DynamicLibNotFoundError. So every call that gets
that far was accepted by the binding (arity, argument types, handle types): a binding
whose signature changed (e.g. cuGraphInstantiate's flags form) fails here with a
TypeError. The Device is made without its constructor (which needs the driver); its
methods are the real ones, calling the real bindings. With a GPU the GPU tests run
these calls for real instead.
"""

import ctypes

import numpy as np
import pytest

from tests.gpu.device import has_gpu

driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (the cuda extra)")
pathfinder = pytest.importorskip("cuda.pathfinder")
pytestmark = pytest.mark.skipif(has_gpu(), reason="a GPU is present: the GPU tests make these calls for real")
NO_DRIVER = pathfinder.DynamicLibNotFoundError


@pytest.fixture
def device():
    from mlir_nn.runtime.driver import Device

    device = Device.__new__(Device)
    device.cu, device.context, device.name = driver, driver.CUcontext(0), "no device"
    return device


def test_load_driver_says_cuda_unavailable():
    from mlir_nn.runtime.driver import CudaUnavailable, load_driver

    with pytest.raises(CudaUnavailable, match="driver library could not be loaded for cuInit"):
        load_driver()


def calls(device):
    stream, array = driver.CUstream(0), np.zeros(4, np.float32)
    params = (ctypes.c_void_p * 1)(0)
    return {
        "activate": lambda: device.activate(),
        "alloc": lambda: device.alloc(16, "buffer"),
        "free": lambda: device.free(0),
        "upload": lambda: device.upload(0, array, "x"),
        "download": lambda: device.download(array, 0, "x"),
        "copy": lambda: device.copy(0, 0, 16, "copy"),
        "copy on a stream": lambda: device.copy(0, 0, 16, "copy", stream),
        "load_module": lambda: device.load_module(b"\0" * 16, "module"),
        "function": lambda: device.function(driver.CUmodule(0), "kernel", "kernel"),
        "launch": lambda: device.launch(driver.CUfunction(0), (1, 1, 1), (32, 1, 1), 0, params, "kernel"),
        "launch on a stream": lambda: device.launch(driver.CUfunction(0), (2, 1, 1), (1, 1, 1), 8, params, "k",
                                                    stream),
        "stream": lambda: device.stream(),
        "capture": lambda: device.capture(stream, lambda: None, "step"),
        "replay": lambda: device.replay(driver.CUgraphExec(0), stream, "step"),
        "destroy graph": lambda: device.destroy(driver.CUgraphExec(0)),
        "destroy stream": lambda: device.destroy(stream=stream),
        "synchronize": lambda: device.synchronize("step"),
        "unload": lambda: device.unload(driver.CUmodule(0)),
        "memory_info": lambda: device.memory_info(),
        # what capture() calls after cuStreamBeginCapture, as it calls them
        "cuStreamEndCapture": lambda: driver.cuStreamEndCapture(stream),
        "cuGraphInstantiate": lambda: driver.cuGraphInstantiate(driver.CUgraph(0), 0),
        "cuGraphDestroy": lambda: driver.cuGraphDestroy(driver.CUgraph(0)),
    }


@pytest.mark.parametrize("name", list(calls(None)))
def test_the_binding_accepts_the_call(device, name):
    with pytest.raises(NO_DRIVER):
        calls(device)[name]()


def test_a_signature_mismatch_would_be_caught():
    with pytest.raises(TypeError):
        driver.cuGraphInstantiate(driver.CUgraph(0))  # the CUDA 11 form, without flags
    with pytest.raises(TypeError):
        driver.cuLaunchKernel(driver.CUfunction(0), 1, 1, 1, 1, 1, 1, 0, driver.CUstream(0), "params", 0)
