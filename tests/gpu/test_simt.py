"""The SIMT interpreter: compiled steps against the reference, and the defects it must catch."""

import re
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn.backends.cuda import compile_graph
from mlir_nn.gpu.simt import Buffer, MemRef, Report, SimtProgram
from mlir_nn.gpu.simt_check import check_graph, check_program
from tests.gpu.test_graph_steps import traced


@pytest.fixture(scope="module")
def moons():
    graph = traced("2,32,32,16,1", 10, optimized=True)
    return graph, compile_graph(graph, (), cubin=False)


@pytest.mark.parametrize("batch", [1, 7, 33])
def test_moons_step_is_clean_at_awkward_batches(moons, batch):
    graph, program = moons
    result = check_graph(graph, batch, program=program)
    assert result.ok, result.problems
    assert result.report.kernels >= 26 and result.max_rel_err < 1e-5


def test_second_reduction_kernel_runs_past_one_block():
    """More than 1024 rows: the loss and bias gradients take their second (partials) kernel."""
    from mlir_nn.runtime.plan import Launch, bind

    graph = traced("2,3,1", 1100, optimized=True)
    program = compile_graph(graph, (), cubin=False)
    result = check_graph(graph, 1100, program=program)
    assert result.ok, result.problems
    shapes = [tuple(1100 if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
    launched = [a for a in bind(program.plan, shapes).actions if isinstance(a, Launch)]
    assert result.report.kernels == len(launched) > 0
    assert any(a.kernel.endswith("_partial") for a in launched)


@pytest.mark.parametrize("batch", [1, 300])
def test_wide_bias_gradients_are_clean(batch):
    """70 outputs (the wide form: a thread per output, 19 row chunks at batch 300, one at batch 1)."""
    result = check_graph(traced("3,70,2", batch, optimized=True), batch)
    assert result.ok, result.problems


def test_wide_reductions_fill_the_gpu():
    """The large step's 1024-wide bias gradients take many blocks, not 4 threads' worth of blocks."""
    from mlir_nn.runtime.plan import bind

    graph = traced("784,1024,1024,10", 512, optimized=True)
    program = compile_graph(graph, (), cubin=False)
    shapes = [tuple(512 if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
    launches = [a for a in bind(program.plan, shapes).actions if hasattr(a, "kernel")]
    partial = [a for a in launches if a.kernel.endswith("_sum_to_partial") and a.grid[1] == 4]
    assert len(partial) == 2 and all(a.grid[0] * a.grid[1] == 128 for a in partial)


def test_adam_step_is_clean():
    result = check_graph(traced("3,17,2", 7, optimized=True, extra=("--optimizer", "adam")), 7)
    assert result.ok, result.problems


def test_large_step_at_reduced_width_is_clean():
    result = check_graph(traced("784,48,40,10", 33, optimized=True), 33)
    assert result.ok, result.problems


def test_products_across_several_tiles_with_ragged_edges():
    """Batch 65 (two row tiles), width 72 (two column tiles), K = 100 (not a multiple of 16)."""
    result = check_graph(traced("100,72,10", 65, optimized=True), 65)
    assert result.ok, result.problems


@pytest.mark.parametrize("kernel,which", [("step_k01_linear_tile64", 0), ("step_k03_linear_tile64", 1)],
                         ids=["before-the-first-product", "between-K-steps"])
def test_a_removed_barrier_is_caught(moons, kernel, which):
    """Drop the barrier after staging the first tiles, or the one closing a K step (K = 32: two steps)."""
    graph, program = moons
    result = check_program(graph, _without(program.gpu_text, kernel, r"gpu\.barrier\n", which), program.plan, 7)
    assert not result.ok and result.report.races
    assert kernel in result.report.races[0] and "shared" in result.report.races[0]
    assert check_program(graph, program.gpu_text, program.plan, 7).ok  # the real kernels are clean


@pytest.mark.parametrize("which", [0, 1], ids=["first-tiles", "between-K-steps"])
def test_a_removed_async_wait_is_caught(moons, which):
    """Without its wait, a K step's product reads shared memory that its async copies have not written yet."""
    graph, program = moons
    kernel = "step_k03_linear_tile64"  # B (a 32 x 32 weight) arrives by cp.async
    broken = _without(program.gpu_text, kernel, r"nvgpu\.device_async_wait %\w+\n", which)
    result = check_program(graph, broken, program.plan, 7)
    assert not result.ok
    assert any(kernel in r and "async copy is still writing" in r for r in result.report.races)


def _without(text: str, kernel: str, line: str, which: int) -> str:
    """``text`` without the ``which``-th match of ``line`` in ``kernel``."""
    start = text.index(f"gpu.func @{kernel}")
    match = list(re.finditer(line, text[start:]))[which]
    return text[:start + match.start()] + text[start + match.end():]


def test_a_wrong_result_is_caught(moons):
    """Changing one op of a launched kernel shows as a mismatch against the reference."""
    graph, program = moons
    text = program.gpu_text
    start = text.index("gpu.func @step_k01_linear_tile64")
    broken = text[:start] + text[start:].replace("arith.maximumf", "arith.minimumf", 1)
    assert broken != text
    result = check_program(graph, broken, program.plan, 7)
    assert result.report.clean and not result.ok and result.max_rel_err > 1e-2


KERNELS = """
gpu.module @m {
  gpu.func @shift(%a: memref<8xf32>, %b: memref<8xf32>) kernel {
    %c1 = arith.constant 1 : index
    %t = gpu.thread_id x
    %n = arith.addi %t, %c1 : index
    %v = memref.load %a[%n] : memref<8xf32>
    memref.store %v, %b[%t] : memref<8xf32>
    gpu.return
  }
  gpu.func @divergent(%a: memref<8xf32>) kernel {
    %c3 = arith.constant 3 : index
    %t = gpu.thread_id x
    %low = arith.cmpi ult, %t, %c3 : index
    scf.if %low {
      gpu.barrier
    }
    gpu.return
  }
  gpu.func @triangle(%a: memref<8xf32>) kernel {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %one = arith.constant 1.0 : f32
    %t = gpu.thread_id x
    %s = scf.for %i = %c0 to %t step %c1 iter_args(%acc = %one) -> (f32) {
      %d = arith.addf %acc, %acc : f32
      scf.yield %d : f32
    }
    memref.store %s, %a[%t] : memref<8xf32>
    gpu.return
  }
  gpu.func @all_write_one(%a: memref<8xf32>) kernel {
    %c0 = arith.constant 0 : index
    %one = arith.constant 1.0 : f32
    memref.store %one, %a[%c0] : memref<8xf32>
    gpu.return
  }
}
"""


@pytest.fixture(scope="module")
def kernels():
    program = SimtProgram(KERNELS, {"program": []})
    return {name: k for (_, name), k in program.kernels.items()}


def _buffer(values):
    data = np.asarray(values, np.float32)
    return MemRef(Buffer("a", data.view(np.uint8).copy()), np.float32, 0, [len(data)], [1])


def test_out_of_bounds_is_reported(kernels):
    a, b, report = _buffer(np.arange(8)), _buffer(np.zeros(8)), Report()
    kernels["shift"].launch([a, b], (1, 1, 1), (8, 1, 1), report)
    assert len(report.out_of_bounds) == 1 and "block (0, 0, 0), thread (7, 0, 0)" in report.out_of_bounds[0]
    np.testing.assert_array_equal(b.buffer.typed(np.float32)[:7], np.arange(1, 8))


def test_barrier_under_divergent_branch_is_reported(kernels):
    report = Report()
    kernels["divergent"].launch([_buffer(np.zeros(8))], (2, 1, 1), (8, 1, 1), report)
    assert report.divergent_barriers and "2 blocks" in report.divergent_barriers[0]
    uniform = Report()
    kernels["divergent"].launch([_buffer(np.zeros(8))], (1, 1, 1), (2, 1, 1), uniform)
    assert uniform.clean


def test_loops_with_per_thread_trip_counts(kernels):
    a, report = _buffer(np.zeros(8)), Report()
    kernels["triangle"].launch([a], (1, 1, 1), (8, 1, 1), report)
    assert report.clean
    np.testing.assert_array_equal(a.buffer.typed(np.float32), 2.0 ** np.arange(8))


def test_threads_writing_one_address_race(kernels):
    report = Report()
    kernels["all_write_one"].launch([_buffer(np.zeros(8))], (1, 1, 1), (4, 1, 1), report)
    assert report.races and "two threads" in report.races[0]
    across_blocks = Report()
    kernels["all_write_one"].launch([_buffer(np.zeros(8))], (3, 1, 1), (1, 1, 1), across_blocks)
    assert any("two blocks" in race for race in across_blocks.races)


def test_cli_simt_check():
    proc = subprocess.run([sys.executable, "-m", "mlir_nn.cli", "compile", "--mlp", "2,8,1", "--batch", "7",
                           "--target", "cuda", "--simt-check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"simt: \d+ kernels, 0 races, max rel err \d\.\d\de[-+]\d\d\n", proc.stdout)
