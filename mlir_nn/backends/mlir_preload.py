"""MLIR's native library loaded on another core while a step traces.

``import mlir.ir`` spends most of its time in the dynamic loader, relocating the ~200 MB
``libMLIRPythonCAPI.so`` (a fresh process: 55-70 ms of 60-90), and the import holds the GIL
throughout. ``start`` loads that library first, by ``dlopen`` called through ctypes (which
releases the GIL) on a thread of its own: the loader works on the other core while the step
traces, and the import finds the library loaded. Alternated fresh processes on 2 busy cores:
a Python loop beside the ctypes ``dlopen`` kept 60-80% of its speed (beside ``ctypes.CDLL``,
which holds the GIL, 7%), and ``import mlir.ir`` after it took 100-140 ms against 200-215.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

from mlir_nn.backends.native import package_file

LIBRARY = "libMLIRPythonCAPI.so"
LLVM_LIBRARY = ("llvm", "lib/libLLVM.so")  # (package, file): what MLIR's library links, and ``llvm_jit`` calls
_loading: dict[str, threading.Thread] = {}  # started once per process and library


def start() -> None:
    """Start loading ``LIBRARY`` in the background, once per process, unless MLIR is imported
    already or its package has no such library (the import then loads what it needs itself)."""
    if "mlir._mlir_libs._mlir" not in sys.modules:
        _start("mlir", f"_mlir_libs/{LIBRARY}")


def start_llvm() -> None:
    """Start loading LLVM's library alone (a fifth of MLIR's load), for a step that the baseline
    compiler (``baseline``) compiles without MLIR."""
    _start(*LLVM_LIBRARY)


def _start(package: str, relative: str) -> None:
    if relative in _loading:
        return
    path = package_file(package, relative)
    if path is not None:
        _loading[relative] = threading.Thread(target=_load, args=(path,), name="mlir_nn-preload", daemon=True)
        _loading[relative].start()


def _load(path: Path) -> None:
    """``dlopen`` the library without the GIL; its handle is kept (MLIR is never unloaded).
    Lazily bound: its 23k calls through the PLT resolve at their first call, not at
    the load (the import of ``mlir.ir``, with ``RTLD_NOW``, leaves a loaded library as it is):
    the load took 33-36 ms against 55-67, and the 8x64 SGD MLP's quick first call (fresh
    processes alternated, 2 cores) 299-404 ms, median 348 -> 278-343, median 320."""
    dlopen = ctypes.CDLL(None).dlopen
    dlopen.restype, dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    dlopen(os.fsencode(path), os.RTLD_LAZY)


def _finish_before_fork() -> None:
    """A fork waits for the load: a child forked while the loader held its lock would hang at its
    own first ``dlopen``."""
    for thread in list(_loading.values()):
        thread.join()


os.register_at_fork(before=_finish_before_fork)
