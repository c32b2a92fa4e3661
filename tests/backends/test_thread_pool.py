"""MLIR_NN_NUM_THREADS sizes the pool that runs the tasks of compiled steps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mlir_nn.backends import thread_pool

PROGRAM = """
import os
import numpy as np
from mlir_nn.backends.cpu import compile_kernel
from tests.backends.test_cpu_parallel import K, M, check
from tests.codegen.zoo import matmul_zoo

before = len(os.listdir("/proc/self/task"))
assert compile_kernel(matmul_zoo(K, M, "float32")).threaded
check(matmul_zoo(K, M, "float32"), 257, 0)  # the parallel products match the reference
print(len(os.listdir("/proc/self/task")) - before)
"""


def _threads_started(value: str) -> int:
    env = dict(os.environ, MLIR_NN_NUM_THREADS=value)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_one_thread_requested_starts_a_single_pool_thread():
    assert _threads_started("1") == 1


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_thread_counts_are_refused_with_the_variable_named(monkeypatch, value):
    monkeypatch.setenv(thread_pool.ENV, value)
    with pytest.raises(ValueError, match="MLIR_NN_NUM_THREADS"):
        thread_pool.num_threads()


def test_the_default_is_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.delenv(thread_pool.ENV, raising=False)
    assert thread_pool.num_threads() == thread_pool.available_cores()
    assert thread_pool.pool_size() == thread_pool.available_cores()
