"""Reductions over the batch in two parallel kernels (mlir_nn.gpu.reduction), run on the CPU emulator."""

import subprocess

import pytest

from mlir_nn.gpu import reduction
from mlir_nn.ir import Graph
from mlir_nn.ir.graph import make_node
from mlir_nn.runtime.plan import bind, check_launch_abi
from tests.gpu.conftest import PTXAS
from tests.gpu.test_emulate import check_against_reference, emulated
from tests.gpu.test_graph_steps import traced

# 1 and 10: one block; 33: a partial block; 1000 and 3000: (N, 8) sums take 2 and 24 blocks
BATCHES = [1, 10, 33, 1000, 3000]


def reductions_graph() -> Graph:
    """Scalar sums and means over every axis (batch included), a loss and small column sums."""
    x = make_node("input", (), name="x", shape=("N", 8), dtype="float32")
    y = make_node("input", (), name="y", shape=("N", 8), dtype="float32")
    w = make_node("param", (), name="w", shape=(8,), dtype="float32")
    xw = make_node("mul", (x, w))
    outputs = (
        make_node("sum", (make_node("mul", (x, y)),), axes=(0, 1), keepdims=False),
        make_node("mean", (make_node("tanh", (xw,)),), axes=(0, 1), keepdims=False),
        make_node("mse", (xw, y)),
        make_node("sum_to", (xw,), shape=(8,)),
        make_node("mean", (x,), axes=(0,), keepdims=False),
    )
    return Graph((x, y), (w,), outputs, (("w", make_node("sub", (w, make_node("sum_to", (y,), shape=(8,))))),))


def test_scalar_and_column_reductions_match_the_reference():
    graph = reductions_graph()
    check_against_reference(graph, emulated(graph), BATCHES)


def test_training_steps_match_the_reference_at_every_batch():
    for mlp, flags in [("2,8,1", []), ("3,5,2", ["--optimizer", "adam"])]:
        graph = traced(mlp, 10, optimized=True, extra=flags)
        check_against_reference(graph, emulated(graph), BATCHES)


def test_the_second_kernel_runs_only_for_large_batches(tmp_path):
    from mlir_nn.backends.cuda import compile_graph

    graph = traced("2,8,1", 10, optimized=True)
    program = compile_graph(graph, ("sm_80", "sm_90"))
    splits = program.schedules["reduction"] // 2  # the loss and two bias gradients
    assert splits == 3 and "sequential" in program.schedules  # only the 0-d loss epilogue is left to one thread

    def launches(batch):
        shapes = [tuple(batch if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
        bound = bind(program.plan, shapes)
        return [a for a in bound.actions if hasattr(a, "kernel")]

    small, large = launches(10), launches(reduction.THREADS * reduction.ITEMS + 1)
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    unused_tilings = sum(k.endswith("_tile128") for k in kernels)  # too few blocks for the 128 x 128 tiles
    assert len(large) == len(small) + splits == program.kernel_count - unused_tilings
    grids = sorted(a.grid for a in large if a.block == (reduction.THREADS, 1, 1))
    assert (2, 1, 1) in grids  # kernel 1 over the batch: two blocks
    huge = launches(10**7)
    assert max(a.grid[0] for a in huge if a.block == (reduction.THREADS, 1, 1)) == reduction.MAX_BLOCKS
    for arch in ("sm_80", "sm_90"):
        for launch in large:  # every kernel, the second ones included
            check_launch_abi(launch, program.ptx[arch][launch.binary])
            assert program.cubin[arch][launch.binary][:4] == b"\x7fELF"
        if PTXAS:
            for launch in large:
                if launch.block == (reduction.THREADS, 1, 1):
                    ptx = tmp_path / f"{launch.binary}.ptx"
                    ptx.write_text(program.ptx[arch][launch.binary])
                    proc = subprocess.run([PTXAS, f"-arch={arch}", str(ptx), "-o", str(tmp_path / "k.cubin")],
                                          capture_output=True, text=True)
                    assert proc.returncode == 0, proc.stderr


def test_a_block_sum_that_drops_threads_is_caught(monkeypatch):
    """The check can fail: each block keeping only its thread 0's sum gives other numbers."""

    def thread_zero_only(shared, write_total):
        _, ip = reduction._thread_loop(1)
        with ip:
            write_total(reduction.memref.load(shared, [reduction._index(0)]))

    monkeypatch.setattr(reduction, "_block_sum", thread_zero_only)
    graph = reductions_graph()
    with pytest.raises(AssertionError, match="result"):
        check_against_reference(graph, emulated(graph), [10])
