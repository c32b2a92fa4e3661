"""Two ways to average a step's gradients over 2 ranks, timed on the same buffers.

* ``in-step``: a function JIT-compiled from MLIR's ``mpi`` dialect (``mpi.allreduce``,
  lowered by ``convert-to-llvm`` to MPICH ABI calls of ``MPI_Allreduce``) and a loop scaling
  by 1/size: what a compiled step holding the reduction would run, called through the
  packed C interface as the CPU backend calls steps; one call per gradient, or one call on
  the gradients packed in one buffer.
* ``between halves (mpi4py)``: ``comm.allreduce_mean``, the reduction the split step runs
  between its two compiled halves (pack, one non-blocking allreduce polled against the
  timeout, unpack).

Payloads: the gradients of the moons MLP 2-32-32-16-1 and of the large MLP 784-1024-1024-10.
Runs itself under ``mpiexec -n 2``; rank 0 prints median microseconds per call.

    python benchmarks/allreduce_lowering.py [--reps 200]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PAYLOADS = {"moons 2-32-32-16-1": [2, 32, 32, 16, 1], "large 784-1024-1024-10": [784, 1024, 1024, 10]}


def gradient_shapes(sizes: list[int]) -> list[int]:
    """Element counts of each layer's weight and bias gradient."""
    counts = []
    for nin, nout in zip(sizes, sizes[1:]):
        counts += [nin * nout, nout]
    return counts


def mpi_dialect_module(count: int, world: int) -> str:
    """func @mean_allreduce(send0, recv0, send1, recv1, ...): recv_i = mean over ranks of send_i."""
    args = ", ".join(f"%s{i}: memref<?xf32>, %r{i}: memref<?xf32>" for i in range(count))
    body = []
    for i in range(count):
        body += [f"    mpi.allreduce(%s{i}, %r{i}, MPI_SUM, %comm) : memref<?xf32>, memref<?xf32>",
                 f"    %n{i} = memref.dim %r{i}, %c0 : memref<?xf32>",
                 f"    scf.for %j = %c0 to %n{i} step %c1 {{",
                 f"      %v = memref.load %r{i}[%j] : memref<?xf32>",
                 "      %m = arith.mulf %v, %scale : f32",
                 f"      memref.store %m, %r{i}[%j] : memref<?xf32>",
                 "    }"]
    lines = "\n".join(body)
    return f"""module attributes {{dlti.map = #dlti.map<"MPI:Implementation" = "MPICH">}} {{
  func.func @mean_allreduce({args}) attributes {{llvm.emit_c_interface}} {{
    %comm = mpi.comm_world : !mpi.comm
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %scale = arith.constant {1.0 / world} : f32
{lines}
    return
  }}
}}"""


def loaded_libmpi() -> str:
    """Path of the MPI library mpi4py loaded into this process."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/libmpi" in path and ".so" in path:
            return path
    raise RuntimeError("no libmpi*.so is mapped into this process")


def compile_native(count: int, world: int):
    from mlir import ir, passmanager
    from mlir.execution_engine import ExecutionEngine

    ctypes.CDLL(loaded_libmpi(), mode=ctypes.RTLD_GLOBAL)  # the JIT resolves MPI_* among global symbols
    with ir.Context():
        module = ir.Module.parse(mpi_dialect_module(count, world))
        passmanager.PassManager.parse(
            "builtin.module(convert-scf-to-cf,convert-to-llvm,reconcile-unrealized-casts)").run(module.operation)
        engine = ExecutionEngine(module, opt_level=2)
        address = engine.raw_lookup("_mlir_ciface_mean_allreduce")
    return engine, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)


def worker(reps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from mlir_nn.backends.memref_args import ArgumentBlock
    from mlir_nn.distributed import comm

    comm.init()
    mpi = comm._mpi().COMM_WORLD
    for label, sizes in PAYLOADS.items():
        rng = np.random.default_rng(comm.rank())
        grads = [rng.standard_normal(n).astype(np.float32) for n in gradient_shapes(sizes)]
        received = [np.empty_like(g) for g in grads]
        packed, packed_received = np.concatenate(grads), np.empty(sum(g.size for g in grads), np.float32)
        calls = {}
        for name, sends, receives in (("in-step, call per gradient", grads, received),
                                      ("in-step, one packed call", [packed], [packed_received])):
            engine, native = compile_native(len(sends), comm.size())
            block = ArgumentBlock([1] * (2 * len(sends)))
            for i, (g, r) in enumerate(zip(sends, receives)):
                block.bind(2 * i, g)
                block.bind(2 * i + 1, r)
            calls[name] = (engine, native, block.address, block)
        want = comm.allreduce_mean(grads)
        for _, native, address, _ in calls.values():
            native(address)
        got = [received, np.split(packed_received, np.cumsum([g.size for g in grads])[:-1])]
        if not all(np.allclose(a, b, rtol=1e-6, atol=1e-6) for result in got for a, b in zip(result, want)):
            raise AssertionError("the mpi dialect's mean differs from comm.allreduce_mean")
        timings: dict[str, list[float]] = {name: [] for name in [*calls, "between halves (mpi4py)"]}
        for _ in range(reps):  # interleaved, both ranks in lockstep
            for name in timings:
                mpi.Barrier()
                start = time.perf_counter()
                if name in calls:
                    calls[name][1](calls[name][2])
                else:
                    comm.allreduce_mean(grads)
                timings[name].append(time.perf_counter() - start)
        calls.clear()
        if comm.rank() == 0:
            floats = sum(g.size for g in grads)
            print(f"{label}: {len(grads)} gradients, {floats} floats ({floats * 4 / 1e6:.2f} MB)")
            for name, ts in timings.items():
                print(f"  {name:28s} median {statistics.median(ts) * 1e6:9.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.reps)
        return
    mpiexec = Path(sys.executable).parent / "mpiexec"
    print(f"2 ranks, {os.cpu_count()} cpus, 1-min load {os.getloadavg()[0]:.1f}")
    subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, "--worker", "--reps", str(args.reps)],
                   check=True, timeout=1800)


if __name__ == "__main__":
    main()
