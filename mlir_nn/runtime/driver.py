"""A thin, checked layer over the CUDA driver API of ``cuda-bindings``.

Every call's status is checked: a failure raises ``CudaError`` naming what was being
done (the kernel, for launches) and the driver's error name and string; running out
of memory raises ``CudaOutOfMemory`` with the sizes asked for.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

INSTALL_HINT = "install it with: pip install 'mlir-nn[cuda]' (the cuda-bindings package)"


class CudaUnavailable(RuntimeError):
    """The CUDA backend cannot run here (no cuda-bindings, no driver or no GPU)."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class CudaOutOfMemory(CudaError, MemoryError):
    """Device memory ran out."""


def load_driver() -> Any:
    """The ``cuda.bindings.driver`` module, initialized; CudaUnavailable says why not."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise CudaUnavailable(f"the CUDA backend needs the cuda-bindings package, which is not importable ({e}); "
                              f"{INSTALL_HINT}") from None
    try:
        (err,) = driver.cuInit(0)
    except RuntimeError as e:  # cuda-bindings 13 loads libcuda.so at the first call (cuda.pathfinder's error)
        raise CudaUnavailable(f"the CUDA driver library could not be loaded for cuInit ({e}); "
                              "is there an NVIDIA GPU and driver on this machine?") from None
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaUnavailable(f"the CUDA driver could not be initialized: cuInit failed with {_describe(driver, err)} "
                              "(is there an NVIDIA GPU and driver on this machine?)")
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        raise CudaUnavailable("the CUDA driver reports no GPU device on this machine")
    return driver


def _describe(driver: Any, err: Any) -> str:
    _, name = driver.cuGetErrorName(err)
    _, text = driver.cuGetErrorString(err)
    return f"{_text(name)} ({_text(text)})"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Device:
    """One GPU's primary context (shared with PyTorch/CuPy in the same process)."""

    def __init__(self, ordinal: int = 0) -> None:
        self.cu = load_driver()
        cu = self.cu
        self.device = self.check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.context = self.check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        attr = cu.CUdevice_attribute
        self.capability = (
            self.check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "attr"),
            self.check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "attr"),
        )
        raw = self.check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = _text(raw).split("\x00")[0]

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    def check(self, result: tuple, what: str, nbytes: int | None = None) -> Any:
        """Raise on a failed status; return the call's value (None, one value or a tuple)."""
        err, rest = result[0], result[1:]
        if err != self.cu.CUresult.CUDA_SUCCESS:
            if err == self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                free, total = self.memory_info()
                asked = f" asking for {nbytes} bytes" if nbytes is not None else ""
                raise CudaOutOfMemory(f"{what}: out of device memory{asked} ({free} of {total} bytes free on "
                                      f"{self.name})")
            raise CudaError(f"{what}: {_describe(self.cu, err)}")
        return None if not rest else rest[0] if len(rest) == 1 else rest

    def memory_info(self) -> tuple[int, int]:
        err, free, total = self.cu.cuMemGetInfo()
        return (int(free), int(total)) if err == self.cu.CUresult.CUDA_SUCCESS else (-1, -1)

    def activate(self) -> None:
        self.check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def alloc(self, nbytes: int, what: str) -> int:
        ptr = self.check(self.cu.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc for {what}", nbytes)
        return int(ptr)

    def free(self, ptr: int) -> None:
        self.check(self.cu.cuMemFree(self.cu.CUdeviceptr(ptr)), "cuMemFree")

    def upload(self, ptr: int, array: np.ndarray, what: str) -> None:
        array = np.ascontiguousarray(array)
        self.check(self.cu.cuMemcpyHtoD(self.cu.CUdeviceptr(ptr), array.ctypes.data, array.nbytes),
                   f"copy of {what} to the device")

    def download(self, array: np.ndarray, ptr: int, what: str) -> None:
        """Copy into ``array`` (C-contiguous, writable) from the device."""
        self.check(self.cu.cuMemcpyDtoH(array.ctypes.data, self.cu.CUdeviceptr(ptr), array.nbytes),
                   f"copy of {what} from the device")

    def copy(self, dst: int, src: int, nbytes: int, what: str, stream: Any = None) -> None:
        """Device-to-device copy; on ``stream`` (asynchronous) when given."""
        dst_ptr, src_ptr = self.cu.CUdeviceptr(dst), self.cu.CUdeviceptr(src)
        if stream is None:
            self.check(self.cu.cuMemcpyDtoD(dst_ptr, src_ptr, nbytes), what)
        else:
            self.check(self.cu.cuMemcpyDtoDAsync(dst_ptr, src_ptr, nbytes, stream), what)

    def load_module(self, image: bytes, what: str) -> Any:
        data = np.frombuffer(image, dtype=np.uint8).copy()
        module = self.check(self.cu.cuModuleLoadData(data.ctypes.data), f"cuModuleLoadData of {what}")
        return module

    def function(self, module: Any, name: str, what: str) -> Any:
        return self.check(self.cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction {what}")

    def launch(self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
               params: ctypes.Array, what: str, stream: Any = None) -> None:
        stream = self.cu.CUstream(0) if stream is None else stream
        self.check(self.cu.cuLaunchKernel(function, *grid, *block, smem, stream, ctypes.addressof(params), 0),
                   f"launch of kernel {what}")

    # CUDA graphs: a step's launches captured once per batch size and replayed. The stream is
    # a blocking one, so a replay also waits for the synchronous copies (inputs) before it.

    def stream(self) -> Any:
        return self.check(self.cu.cuStreamCreate(int(self.cu.CUstream_flags.CU_STREAM_DEFAULT)), "cuStreamCreate")

    def capture(self, stream: Any, record: Callable[[], None], what: str) -> Any:
        """What ``record`` enqueues on ``stream``, as an instantiated CUDA graph (nothing runs yet).

        If ``record`` fails, the capture is ended and its partial graph destroyed, and
        ``record``'s error is the one raised."""
        mode = self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self.check(self.cu.cuStreamBeginCapture(stream, mode), f"cuStreamBeginCapture for {what}")
        try:
            record()
        except BaseException:
            err, graph = self.cu.cuStreamEndCapture(stream)  # its status (capture invalidated) is not the cause
            if err == self.cu.CUresult.CUDA_SUCCESS and int(graph):
                self.cu.cuGraphDestroy(graph)
            raise
        graph = self.check(self.cu.cuStreamEndCapture(stream), f"cuStreamEndCapture for {what}")
        try:
            return self.check(self.cu.cuGraphInstantiate(graph, 0), f"cuGraphInstantiate for {what}")
        finally:
            self.check(self.cu.cuGraphDestroy(graph), "cuGraphDestroy")

    def replay(self, executable: Any, stream: Any, what: str) -> None:
        """Launch a captured graph on ``stream`` and wait for it."""
        self.check(self.cu.cuGraphLaunch(executable, stream), f"cuGraphLaunch for {what}")
        self.check(self.cu.cuStreamSynchronize(stream), what)

    def destroy(self, executable: Any = None, stream: Any = None) -> None:
        if executable is not None:
            self.check(self.cu.cuGraphExecDestroy(executable), "cuGraphExecDestroy")
        if stream is not None:
            self.check(self.cu.cuStreamDestroy(stream), "cuStreamDestroy")

    def synchronize(self, what: str) -> None:
        self.check(self.cu.cuCtxSynchronize(), what)

    def unload(self, module: Any) -> None:
        self.check(self.cu.cuModuleUnload(module), "cuModuleUnload")
