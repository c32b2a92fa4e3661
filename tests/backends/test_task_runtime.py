"""The task runtime (mlir_nn/backends/task_runtime.c): MLIR's async runtime API on a pool
where the waiting thread runs tasks too.

The thread count is fixed per process, so most checks run in a new process with
``MLIR_NN_NUM_THREADS`` set: 1 (no pool thread: the caller runs every task while it waits)
and 3 (more threads than this machine may have cores).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn.backends import task_runtime
from tests.backends.test_cpu import compiled
from tests.backends.test_cpu_parallel import K, M, check
from tests.codegen.zoo import matmul_zoo

# Tokens, values, groups, dependencies, and awaits both blocking (in the function) and
# suspending (in async.execute bodies): out[i] = i * i, then out[0] = 1 from one more value.
ASYNC_PROGRAM = """
func.func @run(%out: memref<?xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %out, %c0 : memref<?xf32>
  %group = async.create_group %n : !async.group
  scf.for %i = %c0 to %n step %c1 {
    %token, %value = async.execute -> !async.value<f32> {
      %as_int = arith.index_cast %i : index to i64
      %f = arith.sitofp %as_int : i64 to f32
      %square = arith.mulf %f, %f : f32
      async.yield %square : f32
    }
    %stored = async.execute [%token] {
      %got = async.await %value : !async.value<f32>
      memref.store %got, %out[%i] : memref<?xf32>
      async.yield
    }
    %rank = async.add_to_group %stored, %group : !async.token
  }
  async.await_all %group
  %last, %one = async.execute -> !async.value<f32> {
    %c = arith.constant 1.0 : f32
    async.yield %c : f32
  }
  async.await %last : !async.token
  %v = async.await %one : !async.value<f32>
  memref.store %v, %out[%c0] : memref<?xf32>
  return
}
"""
ASYNC_PASSES = ("async-to-async-runtime,async-runtime-ref-counting,async-runtime-ref-counting-opt,"
                "convert-async-to-llvm,convert-scf-to-cf,expand-strided-metadata,finalize-memref-to-llvm,convert-arith-to-llvm,"
                "convert-func-to-llvm,convert-cf-to-llvm,reconcile-unrealized-casts")


def settled_live_objects(deadline_s: float = 2.0) -> int:
    """``live_objects()`` once it reads 0, or at the deadline: the thread that finished a
    step's last task drops its references just after the step returns."""
    import time

    end = time.monotonic() + deadline_s
    while task_runtime.live_objects() and time.monotonic() < end:
        time.sleep(0.001)
    return task_runtime.live_objects()


def run_async_program() -> None:
    """Run in a new process: JIT ASYNC_PROGRAM with the task runtime and check it at three sizes."""
    import ctypes

    from mlir import ir
    from mlir.execution_engine import ExecutionEngine
    from mlir.passmanager import PassManager
    from mlir.runtime import get_ranked_memref_descriptor

    from mlir_nn.backends.native import load_task_runtime

    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(ASYNC_PROGRAM)
        PassManager.parse(f"builtin.module({ASYNC_PASSES})").run(module.operation)
        load_task_runtime()
        engine = ExecutionEngine(module, opt_level=2)
        for n in (1, 5, 300):
            out = np.zeros(n, np.float32)
            engine.invoke("run", ctypes.pointer(ctypes.pointer(get_ranked_memref_descriptor(out))))
            want = np.arange(n, dtype=np.float32) ** 2
            want[0] = 1
            np.testing.assert_array_equal(out, want)
    print(settled_live_objects())


def concurrent_steps(rounds: int) -> None:
    """Run in a new process: Python threads call different threaded steps at once (the native
    calls release the GIL), each checked against the reference."""
    import threading

    graphs = [matmul_zoo(K + i, M, "float32") for i in range(3)]
    for graph in graphs:
        check(graph, 5, 0)  # compiled before the threads start
    failures: list[BaseException] = []

    def calls(graph) -> None:
        try:
            for r in range(rounds):
                check(graph, 100 + 37 * r, r)
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=calls, args=(g,)) for g in graphs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    print(settled_live_objects())


def _run(program: str, threads: int) -> str:
    env = dict(os.environ, MLIR_NN_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("threads", [1, 3])
def test_tokens_values_and_groups_of_an_async_program(threads):
    program = "from tests.backends.test_task_runtime import run_async_program; run_async_program()"
    assert _run(program, threads) == "0"  # and every object freed


@pytest.mark.parametrize("threads", [1, 2])
def test_steps_called_from_several_threads_at_once_finish_and_match(threads):
    """With no pool thread, a caller may run another step's tasks while it waits: it must
    not leave them behind when its own are done."""
    program = "from tests.backends.test_task_runtime import concurrent_steps; concurrent_steps(6)"
    assert _run(program, threads) == "0"


def test_threaded_steps_leave_no_runtime_object_behind():
    graph = matmul_zoo(K, M, "float32")
    check(graph, 3, 0)
    before = settled_live_objects()
    for batch in (1, 96, 257):
        check(graph, batch, batch)
    assert compiled(graph).kernel.threaded
    assert settled_live_objects() == before == 0


def task_order() -> None:
    """Run in a new process with one computing thread (no pool thread): this thread queues
    tasks 1 and 2, another thread queues 3 and 4, and this one then runs them all while it
    waits. Prints the order they ran in."""
    import ctypes
    import threading

    library = task_runtime.load()
    library.mlirAsyncRuntimeCreateToken.restype = ctypes.c_void_p
    for name in ("mlirAsyncRuntimeEmplaceToken", "mlirAsyncRuntimeAwaitToken", "mlirAsyncRuntimeDropRef"):
        getattr(library, name).restype = None
    resume_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    library.mlirAsyncRuntimeExecute.argtypes = [ctypes.c_void_p, resume_type]
    token = ctypes.c_void_p(library.mlirAsyncRuntimeCreateToken())
    ran: list[int] = []

    @resume_type
    def resume(handle: int) -> None:
        ran.append(handle)
        if len(ran) == 4:
            library.mlirAsyncRuntimeEmplaceToken(token)

    def queue(*handles: int) -> None:
        for handle in handles:
            library.mlirAsyncRuntimeExecute(handle, resume)

    queue(1, 2)
    other = threading.Thread(target=queue, args=(3, 4))
    other.start()
    other.join()
    library.mlirAsyncRuntimeAwaitToken(token)
    library.mlirAsyncRuntimeDropRef(token, ctypes.c_int64(1))
    print(" ".join(map(str, ran)))


def test_a_thread_runs_its_newest_task_first_and_the_oldest_of_others():
    """A parallel loop's dispatch queues the upper half of its blocks, then the upper half of
    what is left: the thread that queued them takes back the nearest range (its newest task),
    another thread the largest (the oldest), so each keeps to its side of the rows loop after
    loop. In queue order this thread would run 1 2 3 4."""
    program = "from tests.backends.test_task_runtime import task_order; task_order()"
    assert _run(program, 1) == "2 1 3 4"
