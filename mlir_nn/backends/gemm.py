"""The C GEMM that the quick tier's products call (``gemm.c``, ``codegen.gemm_calls``).

Built once per machine and cache (``c_build``) with -O3 -march=native, keyed by the source and
the host CPU (``cpu_identity``), and loaded with global symbols before a step that calls it, as
the task runtime is: the linked shared objects find ``mlirnn_gemm_f32`` and ``mlirnn_gemm_f64``
among the process's symbols. Its build (about 0.5 s of ``cc``) is started as a quick-tier step
traces (``prepare``), on the core that the trace leaves free.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from mlir_nn.backends.c_build import CBuild
from mlir_nn.support.cpu_target import cpu_identity

# what it defines, as ``codegen.gemm_calls.SYMBOLS`` names them (not imported: that loads MLIR,
# which loading a cached step does not)
SYMBOLS = ("mlirnn_gemm_f32", "mlirnn_gemm_f64")
BUILD = CBuild(Path(__file__).with_name("gemm.c"), "gemm", "libmlirnn_gemm.so", "matrix products' library",
               lambda: ["-O3", "-march=native"], lambda: [cpu_identity().encode()])


def prepare() -> None:
    """Start building the library in the background unless it is loaded or the cache holds it."""
    if not load.cache_info().currsize:
        BUILD.prepare()


@cache
def load() -> ctypes.CDLL:
    """The library, built if needed and loaded once with global symbols."""
    return BUILD.load_global()


@contextmanager
def threads(count: int) -> Iterator[None]:
    """Products of the block on up to ``count`` threads (``gemm.c``: large ones cut in two halves,
    one on a helper thread); one again after it. Nothing to set when the library is not loaded
    (no step that calls it has run)."""
    if not load.cache_info().currsize:
        yield
        return
    library = load()
    library.mlirnn_gemm_set_threads(ctypes.c_int(count))
    try:
        yield
    finally:
        library.mlirnn_gemm_set_threads(ctypes.c_int(1))
