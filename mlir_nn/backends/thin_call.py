"""The thin call: a small C extension (``thin_call.c``) that checks a compiled step's
arguments, binds their descriptors and calls its native code in one C function.

It is built against ``Python.h`` and NumPy's headers once per machine and cache
(``c_build``; keyed by the source, the Python ABI and the NumPy version): like the
compiled steps' shared objects, it needs ``cc`` once.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np

from mlir_nn.backends.c_build import CBuild
from mlir_nn.backends.errors import NativeError

MODULE = "_thin_call"


def _flags() -> list[str]:
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise NativeError(f"Python.h not found in {include}: install the Python development headers "
                          "to build the cpu backend's call extension")
    return [f"-I{include}", f"-I{np.get_include()}"]


def _key_parts() -> list[bytes]:
    """Besides the source: the interpreter's ABI and NumPy's C API."""
    return [sys.version.encode(), sysconfig.get_config_var("EXT_SUFFIX").encode(), np.__version__.encode()]


BUILD = CBuild(Path(__file__).with_name("thin_call.c"), "thin-call",
               f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}", "call extension", _flags, _key_parts)


def prepare() -> None:
    """Start building the extension in the background unless it is loaded or the cache holds it."""
    if not extension.cache_info().currsize:
        BUILD.prepare()


@cache
def extension() -> ModuleType:
    """The loaded ``_thin_call`` module, built first unless the cache holds it intact."""
    target = BUILD.path()
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(target))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(MODULE, target, loader=loader))
    loader.exec_module(module)
    return module
