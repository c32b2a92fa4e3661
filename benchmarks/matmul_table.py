"""GFLOP/s of each matrix product of the large training step, compiled CPU against NumPy's BLAS.

Each product of the MLP 784-1024-1024-10 step at batch 512 (forward with bias and ReLU,
input gradients with the ReLU mask, weight gradients folded into the SGD update) is
compiled alone as a one-op graph and timed against the same product in NumPy (its BLAS,
OpenBLAS in the wheels) and PyTorch when importable, and against the whole op in NumPy
("fused np": the product and its epilogue, the same work as the compiled op),
round-robin so that machine load hits every contender alike, with a pause before each
contender's turn: OpenBLAS's threads spin for a while after a call and would otherwise take
a core from the next contender
(measured: the compiled product 1.6x slower right after a NumPy call than after a pause).
The ceiling is the measured peak of a loop of independent vector FMAs on every thread.

    python benchmarks/matmul_table.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 512
# (label, op, m, k, n, transpose_a, transpose_b): the large products of the 784-1024-1024-10 step.
SHAPES = [
    ("fwd L0  x @ W0 +b relu", "linear", BATCH, 784, 1024, False, False),
    ("fwd L1  h0 @ W1 +b relu", "linear", BATCH, 1024, 1024, False, False),
    ("fwd L2  h1 @ W2 +b", "linear", BATCH, 1024, 10, False, False),
    ("dX L1   g @ W1^T relu'", "matmul_relu_grad", BATCH, 1024, 1024, False, True),
    ("dX L2   g @ W2^T relu'", "matmul_relu_grad", BATCH, 10, 1024, False, True),
    ("dW L0   W0 - lr x^T g", "gemm", 784, BATCH, 1024, True, False),
    ("dW L1   W1 - lr h0^T g", "gemm", 1024, BATCH, 1024, True, False),
    ("dW L2   W2 - lr h1^T g", "gemm", 1024, BATCH, 10, True, False),
]
LR = 0.005
SETTLE_S = 0.3  # pause before each contender's turn: the previous contender's threads stop spinning
TURN_S = 0.05  # each turn lasts at least this long

FMA_LOOP = """
!v = vector<{lanes}xf32>
func.func @fma_loop(%n: index, %out: memref<{lanes}xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %x = arith.constant dense<1.0000001> : !v
  %y = arith.constant dense<0.9999999> : !v
  %z = arith.constant dense<0.0> : !v
  %r:10 = scf.for %i = %c0 to %n step %c1 iter_args(%a0 = %z, %a1 = %z, %a2 = %z, %a3 = %z, %a4 = %z,
      %a5 = %z, %a6 = %z, %a7 = %z, %a8 = %z, %a9 = %z) -> (!v, !v, !v, !v, !v, !v, !v, !v, !v, !v) {
    %b0 = vector.fma %x, %a0, %y : !v
    %b1 = vector.fma %x, %a1, %y : !v
    %b2 = vector.fma %x, %a2, %y : !v
    %b3 = vector.fma %x, %a3, %y : !v
    %b4 = vector.fma %x, %a4, %y : !v
    %b5 = vector.fma %x, %a5, %y : !v
    %b6 = vector.fma %x, %a6, %y : !v
    %b7 = vector.fma %x, %a7, %y : !v
    %b8 = vector.fma %x, %a8, %y : !v
    %b9 = vector.fma %x, %a9, %y : !v
    scf.yield %b0, %b1, %b2, %b3, %b4, %b5, %b6, %b7, %b8, %b9 : !v, !v, !v, !v, !v, !v, !v, !v, !v, !v
  }
  %s0 = arith.addf %r#0, %r#1 : !v
  %s1 = arith.addf %r#2, %r#3 : !v
  %s2 = arith.addf %r#4, %r#5 : !v
  %s3 = arith.addf %r#6, %r#7 : !v
  %s4 = arith.addf %r#8, %r#9 : !v
  %t0 = arith.addf %s0, %s1 : !v
  %t1 = arith.addf %s2, %s3 : !v
  %t2 = arith.addf %t0, %t1 : !v
  %t3 = arith.addf %t2, %s4 : !v
  vector.store %t3, %out[%c0] : memref<{lanes}xf32>, !v
  return
}
"""
FMA_CHAINS = 10  # independent FMA chains per loop iteration
# Tries of the peak loop, the best counts: one try takes about 25 ms on a Zen 5 core, and a
# process of another user that takes a core for that long halves it (the grid once reported
# the large step at 160% of a peak measured at 275 GFLOP/s instead of 520-566, load 8).
PEAK_TRIES = 15


def fma_burst(threads: int) -> tuple[Callable[[int], None], float]:
    """(a function that runs the FMA loop for a number of iterations on ``threads`` threads at once
    (ctypes calls release the GIL), its floating-point operations per iteration): FMA_CHAINS
    independent FMA chains as wide as the host's vector registers per thread."""
    from mlir import ir
    from mlir.execution_engine import ExecutionEngine
    from mlir.passmanager import PassManager

    from mlir_nn.support.cpu_target import vector_bytes

    lanes = vector_bytes() // 4
    with ir.Context():
        module = ir.Module.parse(FMA_LOOP.replace("{lanes}", str(lanes)))
        PassManager.parse("builtin.module(convert-scf-to-cf,convert-vector-to-llvm,finalize-memref-to-llvm,"
                          "convert-arith-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,"
                          "reconcile-unrealized-casts)").run(module.operation)
        engine = ExecutionEngine(module, opt_level=2)
        packed = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup("_mlir_ciface_fma_loop"))
    outs = [np.zeros(lanes, np.float32) for _ in range(threads)]
    # packed interface: pointers to (the loop count, a pointer to the memref<{lanes}xf32> descriptor)
    descs = [(ctypes.c_int64 * 5)(o.ctypes.data, o.ctypes.data, 0, lanes, 1) for o in outs]
    desc_ptrs = [ctypes.c_void_p(ctypes.addressof(d)) for d in descs]

    held = (module, engine, outs, descs)  # what the pointers below point into, alive while ``call`` is

    def call(count: int, thread: int, _held: tuple = held) -> None:
        n = ctypes.c_int64(count)
        args = (ctypes.c_void_p * 2)(ctypes.addressof(n), ctypes.addressof(desc_ptrs[thread]))
        packed(ctypes.addressof(args))

    def burst(iterations: int) -> None:
        workers = [threading.Thread(target=call, args=(iterations, t)) for t in range(1, threads)]
        for w in workers:
            w.start()
        call(iterations, 0)
        for w in workers:
            w.join()

    call(1000, 0)
    return burst, threads * FMA_CHAINS * lanes * 2


def fma_peak(threads: int, iterations: int = 20_000_000, clock: Callable[[], float] = time.perf_counter) -> float:
    """GFLOP/s of ``fma_burst`` on ``threads`` threads, the best of PEAK_TRIES bursts; per CPU-second
    with ``clock=time.process_time``."""
    burst, flops_per_iteration = fma_burst(threads)
    best = 0.0
    for _ in range(PEAK_TRIES):
        start = clock()
        burst(iterations)
        best = max(best, iterations * flops_per_iteration / (clock() - start) / 1e9)
    return best


def product_graph(op: str, m: int, k: int, n: int, ta: bool, tb: bool):
    """One-op graph: the batch dim is the dynamic N where the step has it; the update
    product writes its parameter in place, as the step does."""
    from mlir_nn.ir import Graph, make_node

    def dim(d: int) -> int | str:
        return "N" if d == BATCH else d

    a_shape = (dim(k), dim(m)) if ta else (dim(m), dim(k))
    b_shape = (dim(n), dim(k)) if tb else (dim(k), dim(n))
    a = make_node("input", [], name="a", shape=a_shape, dtype="float32")
    b_kind = "input" if BATCH in (k, n) else "param"
    b = make_node(b_kind, [], name="b", shape=b_shape, dtype="float32")
    inputs, params = [a], []
    (params if b_kind == "param" else inputs).append(b)
    if op == "linear":
        bias = make_node("param", [], name="bias", shape=(n,), dtype="float32")
        params.append(bias)
        out = make_node("linear", [a, b, bias], activation="relu" if n > 10 else "none")
    elif op == "matmul_relu_grad":
        z = make_node("input", [], name="z", shape=(dim(m), n), dtype="float32")
        inputs.append(z)
        out = make_node("matmul_relu_grad", [a, b, z], transpose_b=tb)
    else:
        c = make_node("param", [], name="c", shape=(m, n), dtype="float32")
        params.append(c)
        lr = make_node("const", [], value=LR, dtype="float32")
        one = make_node("const", [], value=1.0, dtype="float32")
        update = make_node("gemm", [a, b, c, lr, one], transpose_a=ta, subtract=True)  # c - lr * op(a) @ b
        return Graph(tuple(inputs), tuple(params), (), updates=(("c", update),), name="product")  # in place
    return Graph(tuple(inputs), tuple(params), (out,), name="product")


def contenders(op: str, m: int, k: int, n: int, ta: bool, tb: bool) -> dict[str, Callable[[], object]]:
    from mlir_nn.backends.cpu import CpuBackend

    graph = product_graph(op, m, k, n, ta, tb)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([BATCH if d == "N" else d for d in i.shape]).astype(np.float32)
              for i in graph.inputs]
    params = [rng.standard_normal(p.shape).astype(np.float32) for p in graph.params]
    executable = CpuBackend().compile(graph)
    by_name = {node.attr("name"): array for node, array in zip(graph.inputs + graph.params, inputs + params)}
    a, b = by_name["a"], by_name["b"]
    a_op = a.T if ta else a
    b_op = b.T if tb else b
    found = {"compiled cpu": lambda: executable.run(inputs, params), "numpy": lambda: a_op @ b_op,
             "numpy fused": _numpy_fused(op, a_op, b_op, by_name, n)}
    try:
        import torch

        ta_, tb_ = torch.from_numpy(a), torch.from_numpy(b)
        ta_ = ta_.T if ta else ta_
        tb_ = tb_.T if tb else tb_
        found["pytorch"] = lambda: torch.mm(ta_, tb_)
    except ImportError:
        pass
    return found


def _numpy_fused(op: str, a: np.ndarray, b: np.ndarray, by_name: dict[str, np.ndarray],
                 n: int) -> Callable[[], object]:
    """The compiled op's whole work in NumPy: the product and its epilogue (bias and ReLU, the
    ReLU-grad mask, or the SGD update written into its own copy of the parameter)."""
    if op == "linear":
        bias = by_name["bias"]
        return (lambda: np.maximum(a @ b + bias, 0)) if n > 10 else (lambda: a @ b + bias)
    if op == "matmul_relu_grad":
        z = by_name["z"]
        return lambda: np.where(z > 0, a @ b, 0)
    c = by_name["c"].copy()
    return lambda: np.subtract(c, LR * (a @ b), out=c)


def round_robin(fns: dict[str, Callable[[], object]], rounds: int, reps: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median over rounds of each contender's median over a turn of at least ``reps`` calls and
    TURN_S seconds, contenders interleaved (a turn of a few calls right after the pause timed
    small products cold: sleeping pool threads, evicted caches)."""
    for fn in fns.values():
        fn()
    medians: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            time.sleep(SETTLE_S)
            times: list[float] = []
            start = time.perf_counter()
            while len(times) < reps or time.perf_counter() - start < TURN_S:
                t = clock()
                fn()
                times.append(clock() - t)
            medians[label].append(statistics.median(times))
    return {k: statistics.median(v) for k, v in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads of the FMA peak loop (default: the cores this process may use)")
    parser.add_argument("--only", default="", help="run only the shapes whose label contains this text")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by process CPU seconds, for a loaded machine: run it with MLIR_NN_NUM_THREADS=1 "
                             "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 (one computing thread each) so that no "
                             "idle spinning is counted")
    args = parser.parse_args()
    rounds, reps = (3, 3) if args.quick else (7, 5)
    clock = time.process_time if args.cpu_time else time.perf_counter
    peak = fma_peak(1 if args.cpu_time else args.threads, clock=clock)
    unit = "GFLOP per CPU-second, 1 thread" if args.cpu_time else f"GFLOP/s, {args.threads} threads"
    print(f"load average {os.getloadavg()[0]:.2f}; FMA loop peak: {peak:.1f} ({unit})")
    print(f"{'product':26s} {'m x k x n':>16s} {'compiled':>9s} {'numpy':>9s} {'pytorch':>9s} "
          f"{'vs numpy':>9s} {'fused np':>9s} {'vs fused':>9s} {'of peak':>8s}   ({unit})")
    for label, op, m, k, n, ta, tb in SHAPES:
        if args.only not in label:
            continue
        times = round_robin(contenders(op, m, k, n, ta, tb), rounds, reps, clock)
        gflops = {key: 2 * m * k * n / t / 1e9 for key, t in times.items()}
        ours = gflops["compiled cpu"]
        torch_col = f"{gflops['pytorch']:9.1f}" if "pytorch" in gflops else f"{'-':>9s}"
        fused = gflops["numpy fused"]
        print(f"{label:26s} {f'{m}x{k}x{n}':>16s} {ours:9.1f} {gflops['numpy']:9.1f} {torch_col} "
              f"{ours / gflops['numpy']:8.2f}x {fused:9.1f} {ours / fused:8.2f}x {ours / peak:7.0%}")


if __name__ == "__main__":
    main()
