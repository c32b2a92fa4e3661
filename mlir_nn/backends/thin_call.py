"""The thin call: a small C extension (``thin_call.c``) that checks a compiled step's
arguments, binds their descriptors and calls its native code in one C function.

It is built with the machine's C compiler against ``Python.h`` and NumPy's headers the
first time a process needs it, into the compile cache folder (keyed by the source, the
Python ABI and the NumPy version, written atomically with its checksum beside it), and
loaded from there afterwards: like the compiled steps' shared objects, it needs ``cc``
once per machine and cache. A file whose checksum does not match is rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np

from mlir_nn.backends.compile_cache import STAGING_PREFIX, cache_dir, sweep_stale
from mlir_nn.backends.native import NativeError

SOURCE = Path(__file__).with_name("thin_call.c")
MODULE = "_thin_call"


@cache
def _build_key() -> str:
    """What the built extension depends on: its source, the interpreter's ABI and NumPy's C API
    (hashed once per process)."""
    parts = [SOURCE.read_bytes(), sys.version.encode(), sysconfig.get_config_var("EXT_SUFFIX").encode(),
             np.__version__.encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:24]


def _start_build(target: Path) -> tuple[subprocess.Popen, Path]:
    """Start compiling the extension for ``target``: (the compiler's process, its output file)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NativeError("no C compiler (cc or gcc) on PATH: the cpu backend builds its call "
                          "extension (thin_call.c) with it once per machine")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise NativeError(f"Python.h not found in {include}: install the Python development headers "
                          "to build the cpu backend's call extension")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target.parent)  # outputs of builds killed an hour ago or more
    fd, staging = tempfile.mkstemp(prefix=STAGING_PREFIX, suffix=".so", dir=target.parent)
    os.close(fd)
    command = [compiler, "-shared", "-fPIC", "-O2", f"-I{include}", f"-I{np.get_include()}", str(SOURCE),
               "-o", staging]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, Path(staging)


def _finish_build(process: subprocess.Popen, staging: Path, target: Path) -> None:
    """Wait for the compiler, then put its output in place with its checksum beside it."""
    output, _ = process.communicate()
    if process.returncode != 0:
        staging.unlink(missing_ok=True)
        raise NativeError(f"building the cpu backend's call extension failed: {output.strip()}")
    _checksum_file(target).write_text(_sha256(staging))
    os.replace(staging, target)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checksum_file(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _intact(target: Path) -> bool:
    try:
        return target.is_file() and _checksum_file(target).read_text() == _sha256(target)
    except OSError:
        return False


def _target() -> Path:
    return cache_dir() / "thin-call" / _build_key() / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"


_lock = threading.Lock()
_building: tuple[subprocess.Popen, Path, Path] | None = None  # (compiler, its output, target) started by prepare()


def prepare() -> None:
    """Start building the extension in the background unless the cache holds it (a cold compile
    calls this first, so that ``cc`` runs while egglog and LLVM do)."""
    global _building
    with _lock:
        if _building is not None or extension.cache_info().currsize:
            return
        target = _target()
        if not _intact(target):
            _building = (*_start_build(target), target)


@cache
def extension() -> ModuleType:
    """The loaded ``_thin_call`` module, built first unless the cache holds it intact."""
    global _building
    with _lock:
        building, _building = _building, None
        if building is not None:
            _finish_build(*building)
            target = building[2]
        else:
            target = _target()
        if not _intact(target):
            _finish_build(*_start_build(target), target)
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(target))
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(MODULE, target, loader=loader))
        loader.exec_module(module)
        return module
