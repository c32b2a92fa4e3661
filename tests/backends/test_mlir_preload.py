"""MLIR's native library loaded on another thread before the import needs it (``mlir_preload``);
each check in a fresh process, whose MLIR is not loaded yet."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlir_nn.backends import mlir_preload

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")

LOADED = f"""
import sys
from pathlib import Path

def loads():  # how many times the library is mapped from its start: once per load
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sum("{mlir_preload.LIBRARY}" in line and line.split()[2] == "00000000" for line in lines)

def loaded():
    return loads() > 0
"""


def _run(program: str) -> str:
    done = subprocess.run([sys.executable, "-c", LOADED + program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_library_loads_without_importing_mlir_and_once():
    before, after, modules, threads = _run("""
from mlir_nn.backends import mlir_preload
before = loaded()
mlir_preload.start()
(first,) = mlir_preload._loading.values()
mlir_preload.start()
assert list(mlir_preload._loading.values()) == [first]
first.join()
print(before, loaded(), any(name == "mlir" or name.startswith("mlir.") for name in sys.modules), first.daemon)
""")
    assert (before, after, modules, threads) == ("False", "True", "False", "True")


def test_mlir_imports_and_works_after_it_on_the_library_loaded_once():
    assert _run("""
from mlir_nn.backends import mlir_preload
mlir_preload.start()
from mlir import ir
with ir.Context():
    print(ir.Module.parse("func.func @f() { return }").operation.verify(), loads())
""") == ["True", "1"]


def test_nothing_starts_once_mlir_is_imported():
    assert _run("""
import mlir.ir
from mlir_nn.backends import mlir_preload
mlir_preload.start()
print(len(mlir_preload._loading))
""") == ["0"]


def test_llvm_alone_loads_for_the_baseline_compiler_without_mlirs_library():
    assert _run("""
from mlir_nn.backends import mlir_preload
mlir_preload.start_llvm()
(thread,) = mlir_preload._loading.values()
thread.join()
print(loaded(), sum("libLLVM.so" in line for line in Path("/proc/self/maps").read_text().splitlines()) > 0)
""") == ["False", "True"]


def test_a_fork_right_after_the_start_gets_a_working_mlir():
    assert _run("""
import os
from mlir_nn.backends import mlir_preload
mlir_preload.start()
pid = os.fork()
if pid == 0:
    from mlir import ir
    with ir.Context():
        ir.Module.parse("func.func @f() { return }")
    os._exit(0)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""") == ["0"]
