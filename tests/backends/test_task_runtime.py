"""The task runtime (mlir_nn/backends/task_runtime.c): the __kmpc_* functions that MLIR's
OpenMP lowering of parallel loops calls, on a pool where the forking thread works too.

The thread count is fixed per process, so the checks run in a new process with
``MLIR_NN_NUM_THREADS`` set: 1 (no pool thread), 2, 3 and 4 (more threads than this machine
may have cores). The loops are compiled with the cpu pipeline's thread passes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn.backends import task_runtime
from tests.backends.test_cpu_parallel import K, M, check
from tests.codegen.zoo import matmul_zoo

TRIPS = (0, 1, 7, 13, 33, 257, 4099)
# counts[i] += 1 and owner[i] = the thread that ran iteration i, in a parallel loop over i;
# nested: a parallel loop over (i, j) inside one over i, counts[i * m + j] += 1 (the inner loop
# runs serially on the thread that runs i).
LOOPS = """
func.func private @__kmpc_global_thread_num(!llvm.ptr) -> i32
func.func @flat(%counts: memref<?xi32>, %owner: memref<?xi32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1 : i32
  %n = memref.dim %counts, %c0 : memref<?xi32>
  %null = llvm.mlir.zero : !llvm.ptr
  scf.parallel (%i) = (%c0) to (%n) step (%c1) {
    %seen = memref.load %counts[%i] : memref<?xi32>
    %more = arith.addi %seen, %one : i32
    memref.store %more, %counts[%i] : memref<?xi32>
    %me = func.call @__kmpc_global_thread_num(%null) : (!llvm.ptr) -> i32
    memref.store %me, %owner[%i] : memref<?xi32>
    scf.reduce
  }
  return
}
func.func @nested(%counts: memref<?x?xi32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1 : i32
  %n = memref.dim %counts, %c0 : memref<?x?xi32>
  %m = memref.dim %counts, %c1 : memref<?x?xi32>
  scf.parallel (%i) = (%c0) to (%n) step (%c1) {
    scf.parallel (%j) = (%c0) to (%m) step (%c1) {
      %seen = memref.load %counts[%i, %j] : memref<?x?xi32>
      %more = arith.addi %seen, %one : i32
      memref.store %more, %counts[%i, %j] : memref<?x?xi32>
      scf.reduce
    }
    scf.reduce
  }
  return
}
"""
PASSES = ("convert-scf-to-openmp,expand-strided-metadata,finalize-memref-to-llvm,convert-scf-to-cf,"
          "convert-openmp-to-llvm,convert-to-llvm,reconcile-unrealized-casts")


def run_loops(dynamic: bool = False) -> None:
    """Run in a new process: JIT ``LOOPS`` on the task runtime (``dynamic``: with the dynamic
    schedule of split steps' loops); for each trip count print the iterations run other than
    once, whether the owners ascend, and the sizes of the threads' ranges; then the nested
    loop's iterations run other than once."""
    import ctypes

    from mlir import ir
    from mlir.execution_engine import ExecutionEngine
    from mlir.passmanager import PassManager
    from mlir.runtime import get_ranked_memref_descriptor

    from mlir_nn.backends.native import load_task_runtime
    from mlir_nn.backends.parallel_bodies import schedule_worksharing_loops

    def pointer(array: np.ndarray) -> ctypes.c_void_p:
        return ctypes.pointer(ctypes.pointer(get_ranked_memref_descriptor(array)))

    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(LOOPS)
        PassManager.parse(f"builtin.module({PASSES})").run(module.operation)
        if dynamic:
            schedule_worksharing_loops(module, ("flat", "nested"))
        load_task_runtime()
        engine = ExecutionEngine(module, opt_level=2)
        task_runtime.register(engine)
        for trips in TRIPS:
            counts, owner = np.zeros(trips, np.int32), np.full(trips, -1, np.int32)
            engine.invoke("flat", pointer(counts), pointer(owner))
            sizes = np.bincount(owner, minlength=1).tolist()
            print(trips, int(np.sum(counts != 1)), bool(np.all(np.diff(owner) >= 0)), *sizes)
        counts = np.zeros((13, 7), np.int32)
        engine.invoke("nested", pointer(counts))
        print("nested", int(np.sum(counts != 1)))


def _run(program: str, threads: int) -> list[str]:
    env = dict(os.environ, MLIR_NN_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_static_ranges_cover_every_iteration_once_in_order_and_balanced(threads):
    lines = _run("from tests.backends.test_task_runtime import run_loops; run_loops()", threads)
    assert len(lines) == len(TRIPS) + 1
    for trips, line in zip(TRIPS, lines):
        got = line.split()
        assert got[:3] == [str(trips), "0", "True"], line
        sizes = list(map(int, got[3:]))
        if trips < 2:  # a loop of one iteration runs on the forking thread alone
            assert sizes in ([0], [trips]), line
        else:  # thread t runs the t-th of `threads` contiguous ranges, sizes differing by at most one
            assert sizes == [trips // threads + (t < trips % threads) for t in range(threads)], line
    assert lines[-1] == "nested 0"


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_dynamic_schedules_run_every_iteration_once(threads):
    """Each thread starts with its static range and takes the others' iterations once its own
    are done: every iteration runs exactly once, whichever thread runs it."""
    for _ in range(3):  # (which thread takes what varies from run to run)
        lines = _run("from tests.backends.test_task_runtime import run_loops; run_loops(dynamic=True)", threads)
        assert len(lines) == len(TRIPS) + 1
        for trips, line in zip(TRIPS, lines):
            got = line.split()
            assert got[:2] == [str(trips), "0"] and sum(map(int, got[3:])) == trips, line
        assert lines[-1] == "nested 0"


def concurrent_steps(rounds: int) -> None:
    """Run in a new process: Python threads call different threaded steps at once (the native
    calls release the GIL; one team runs at a time, the others' loops run serially), each
    checked against the reference."""
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
    print(task_runtime.teams_forked() > 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_steps_called_from_several_threads_at_once_finish_and_match(threads):
    program = "from tests.backends.test_task_runtime import concurrent_steps; concurrent_steps(6)"
    assert _run(program, threads)[-1] == str(threads > 1)


# a stand-in for another OpenMP runtime in the process (a library's libomp): its __kmpc calls abort
_OTHER_OPENMP = """
#include <stdlib.h>
void __kmpc_fork_call(void) { abort(); }
void __kmpc_for_static_init_8u(void) { abort(); }
void __kmpc_for_static_fini(void) { abort(); }
void __kmpc_barrier(void) { abort(); }
int __kmpc_global_thread_num(void) { abort(); }
"""


def beside_another_openmp(library: str) -> None:
    """Run in a new process: load ``library`` (another runtime's __kmpc functions) with global
    symbols first, then compile and run threaded steps, from the disk cache too, against the
    reference; print how many teams of more than one thread ran."""
    import ctypes

    ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    graph = matmul_zoo(K, M, "float32")
    for batch in (1, 13, 301):
        check(graph, batch, batch)
    print(task_runtime.teams_forked() > 0)


def test_steps_never_bind_to_another_openmp_runtime_nor_it_to_this_one(tmp_path):
    """The runtime defines only wrapped names, so a libomp loaded before it (PyTorch's, in some
    builds) keeps its own __kmpc functions and the steps keep theirs."""
    source, library = tmp_path / "other_openmp.c", tmp_path / "libother_openmp.so"
    source.write_text(_OTHER_OPENMP)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    program = "from tests.backends.test_task_runtime import beside_another_openmp; beside_another_openmp({!r})"
    assert _run(program.format(str(library)), 2)[-1] == "True"
    exported = subprocess.run(["nm", "-D", "--defined-only", str(task_runtime.BUILD.path())], capture_output=True,
                              text=True, check=True).stdout
    assert "__wrap___kmpc_fork_call" in exported and " __kmpc_" not in exported
