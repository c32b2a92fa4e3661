"""MLIR_NN_NUM_THREADS sets the threads that run the tasks of compiled steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlir_nn.backends import thread_pool

PROGRAM = """
import os
from mlir_nn.backends import task_runtime
from mlir_nn.backends.cpu import compile_kernel
from mlir_nn.support import pages
from tests.backends.test_cpu_parallel import K, M, check
from tests.codegen.zoo import matmul_zoo

before = len(os.listdir("/proc/self/task"))
assert compile_kernel(matmul_zoo(K, M, "float32")).threaded
check(matmul_zoo(K, M, "float32"), 257, 0)  # the parallel products match the reference
pages.wait_populated()  # its workspace's pages are in: the thread that faulted them in has ended
print(task_runtime.computing_threads(), len(os.listdir("/proc/self/task")) - before)
"""


def _threads(value: str) -> tuple[int, int]:
    """(computing threads, threads started by a threaded step) in a process with ``value``."""
    env = dict(os.environ, MLIR_NN_NUM_THREADS=value)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    computing, started = done.stdout.split()[-2:]
    return int(computing), int(started)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
@pytest.mark.parametrize("value", ["1", "3"])
def test_the_pool_is_one_thread_smaller_than_the_threads_asked_for(value):
    """The caller of a step is one of the computing threads."""
    assert _threads(value) == (int(value), int(value) - 1)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_thread_counts_are_refused_with_the_variable_named(monkeypatch, value):
    monkeypatch.setenv(thread_pool.ENV, value)
    with pytest.raises(ValueError, match="MLIR_NN_NUM_THREADS"):
        thread_pool.num_threads()


def test_the_default_is_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.delenv(thread_pool.ENV, raising=False)
    assert thread_pool.num_threads() == thread_pool.available_cores()
