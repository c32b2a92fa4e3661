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
    from mlir_nn.runtime.plan import Launch, bind

    graph, program = moons
    result = check_graph(graph, batch, program=program)
    assert result.ok, result.problems
    shapes = [tuple(batch if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
    launched = [a for a in bind(program.plan, shapes).actions if isinstance(a, Launch)]
    assert result.report.kernels == len(launched) >= 20 and result.max_rel_err < 1e-5


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


@pytest.mark.parametrize("widths,batch", [("12,20,8", 1), ("12,20,8", 7), ("12,20,8", 13), ("12,20,8", 33),
                                          ("12,20,8", 257), ("13,33,7", 257), ("7,257,1", 13)])
def test_vector_async_and_scalar_loads_at_awkward_sizes(widths, batch):
    """Widths that are multiples of 4 take the 128-bit loads and the async copies (ragged only in the
    batch); 13, 33, 7 and 257 take the guarded scalar loads."""
    graph = traced(widths, batch, optimized=True)
    program = compile_graph(graph, (), cubin=False)
    four = all(int(w) % 4 == 0 for w in widths.split(","))
    assert ("nvgpu.device_async_copy" in program.gpu_text) == four
    global_vector_load = r"vector\.load %arg\d+\[.*\] .*: memref<\?x\d+xf32>, vector<4xf32>"
    assert (re.search(global_vector_load, program.gpu_text) is not None) == four
    result = check_graph(graph, batch, program=program)
    assert result.ok, result.problems


@pytest.mark.parametrize("widths,batch", [("12,20,8", 7), ("13,33,7", 257), ("12,132,8", 129)])
def test_large_tiles_at_awkward_sizes(monkeypatch, widths, batch):
    """The 128 x 128 kernels (8 x 8 per thread), chosen at small sizes by lowering the rule's SM count."""
    from mlir_nn.gpu import matmul
    from mlir_nn.runtime.plan import Launch, bind

    monkeypatch.setattr(matmul, "SMS", 1)
    graph = traced(widths, batch, optimized=True)
    program = compile_graph(graph, (), cubin=False)
    shapes = [tuple(batch if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
    launched = [a.kernel for a in bind(program.plan, shapes).actions if isinstance(a, Launch)]
    assert sum(k.endswith("_tile128") for k in launched) == 5 and not any(k.endswith("_tile64") for k in launched)
    result = check_graph(graph, batch, program=program)
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


ASYNC_KERNELS = """
gpu.module @m {
  gpu.func @swap(%a: memref<16xf32>, %b: memref<8xf32>, %shift: index, %count: index)
      workgroup(%s: memref<8xf32, #gpu.address_space<workgroup>>) kernel {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c4 = arith.constant 4 : index
    %c8 = arith.constant 8 : index
    %t = gpu.thread_id x
    %mine = arith.muli %t, %c4 : index
    %from = arith.addi %mine, %shift : index
    %token = nvgpu.device_async_copy %a[%from], %s[%mine], 4, %count {bypassL1}
        : memref<16xf32> to memref<8xf32, #gpu.address_space<workgroup>>
    %group = nvgpu.device_async_create_group %token
    nvgpu.device_async_wait %group
    gpu.barrier
    %next = arith.addi %mine, %c4 : index
    %theirs = arith.remui %next, %c8 : index
    scf.for %e = %c0 to %c4 step %c1 {
      %i = arith.addi %theirs, %e : index
      %v = memref.load %s[%i] : memref<8xf32, #gpu.address_space<workgroup>>
      %o = arith.addi %mine, %e : index
      memref.store %v, %b[%o] : memref<8xf32>
    }
    gpu.return
  }
  gpu.func @two_groups(%a: memref<16xf32>, %b: memref<8xf32>, %read: index)
      workgroup(%s: memref<8xf32, #gpu.address_space<workgroup>>) kernel {
    %c0 = arith.constant 0 : index
    %c4 = arith.constant 4 : index
    %first = nvgpu.device_async_copy %a[%c0], %s[%c0], 4
        : memref<16xf32> to memref<8xf32, #gpu.address_space<workgroup>>
    %g1 = nvgpu.device_async_create_group %first
    %second = nvgpu.device_async_copy %a[%c4], %s[%c4], 4
        : memref<16xf32> to memref<8xf32, #gpu.address_space<workgroup>>
    %g2 = nvgpu.device_async_create_group %second
    nvgpu.device_async_wait %g2 {numGroups = 1 : i32}
    %v = memref.load %s[%read] : memref<8xf32, #gpu.address_space<workgroup>>
    memref.store %v, %b[%c0] : memref<8xf32>
    nvgpu.device_async_wait %g2
    gpu.return
  }
}
"""


@pytest.fixture(scope="module")
def async_kernels():
    program = SimtProgram(ASYNC_KERNELS, {"program": []})
    return {name: k for (_, name), k in program.kernels.items()}


def _swap(kernels, shift, count, text=None):
    a, b, report = _buffer(np.arange(16) + 1), _buffer(np.zeros(8)), Report()
    kernel = kernels["swap"] if text is None else SimtProgram(text, {"program": []}).kernels[("m", "swap")]
    kernel.launch([a, b, np.int64(shift), np.int64(count)], (1, 1, 1), (2, 1, 1), report)
    return b.buffer.typed(np.float32), report


def test_async_copies_land_at_the_wait(async_kernels):
    """Each of 2 threads copies 4 floats into shared memory; after the wait and a barrier each reads the other's."""
    b, report = _swap(async_kernels, 0, 4)
    assert report.clean, report
    np.testing.assert_array_equal(b, [5, 6, 7, 8, 1, 2, 3, 4])


def test_async_copies_zero_fill_past_their_source_elements(async_kernels):
    b, report = _swap(async_kernels, 0, 1)
    assert report.clean, report
    np.testing.assert_array_equal(b, [5, 0, 0, 0, 1, 0, 0, 0])
    b, report = _swap(async_kernels, 12, 0)  # nothing read: the source index may be anything
    assert report.clean and not b.any(), report


def test_misaligned_async_copies_are_reported(async_kernels):
    _, report = _swap(async_kernels, 1, 4)
    assert any("not aligned" in r for r in report.out_of_bounds), report


def test_reading_before_the_wait_is_reported(async_kernels):
    text = ASYNC_KERNELS.replace("    nvgpu.device_async_wait %group\n", "", 1)
    b, report = _swap(async_kernels, 0, 4, text)
    assert any("async copy is still writing" in r for r in report.races), report
    assert any("never waited for" in r for r in report.races), report


@pytest.mark.parametrize("read,landed", [(0, True), (4, False)])
def test_wait_leaves_the_newest_groups_in_flight(async_kernels, read, landed):
    """``numGroups = 1``: the first group has landed, the second is still being written."""
    a, b, report = _buffer(np.arange(16) + 1), _buffer(np.zeros(8)), Report()
    async_kernels["two_groups"].launch([a, b, np.int64(read)], (1, 1, 1), (1, 1, 1), report)
    assert report.clean == landed, report
    if landed:
        assert b.buffer.typed(np.float32)[0] == 1
