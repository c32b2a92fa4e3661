"""The step split into kernels: outlining, noalias marks, chunks, merged LLVM text, workers."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends import kernel_build, kernel_pool, kernel_split
from mlir_nn.backends.cpu import CpuExecutable, clear_memory_cache, compile_kernel, lower_with_plan, tail_pipeline
from mlir_nn.backends.kernel_build import Job, build, merge_texts
from mlir_nn.backends.kernel_split import NOALIAS, split_step
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import symbol_name
from mlir_nn.support.pipelines import load_pipeline
from tests.codegen.zoo import arguments, matmul_zoo

# a bufferized step as the split sees it: a product into a workspace view, a copy of one half
# of a parameter into its other half (two views of one buffer), and a second identical fill
STEP = """
func.func @step(%x: memref<4x8xf32>, %p: memref<16xf32>, %ws: memref<?xi8>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %a = memref.view %ws[%c0][] : memref<?xi8> to memref<4x8xf32>
  linalg.fill ins(%zero : f32) outs(%a : memref<4x8xf32>)
  linalg.copy ins(%x : memref<4x8xf32>) outs(%a : memref<4x8xf32>)
  %lo = memref.subview %p[0] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1]>>
  %hi = memref.subview %p[8] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1], offset: 8>>
  memref.copy %lo, %hi : memref<8xf32, strided<[1]>> to memref<8xf32, strided<[1], offset: 8>>
  %b = memref.view %ws[%c8][] : memref<?xi8> to memref<4x8xf32>
  linalg.fill ins(%zero : f32) outs(%b : memref<4x8xf32>)
  return
}
"""


def _kernels_with(split, text: str) -> list[str]:
    return [k for k in split.kernels.values() if text in k]


def test_each_piece_of_work_becomes_a_kernel_called_by_the_step_and_same_pieces_share_one():
    with ir.Context():
        split = split_step(ir.Module.parse(STEP))
        fills = _kernels_with(split, "linalg.fill")
        assert len(fills) == 1 and "arith.constant 0.0" in fills[0]  # constants are copied in
        assert len(split.kernels) == 3
        assert split.step.count("call @k") == 4 and "linalg." not in split.step
        for kernel in split.kernels.values():
            ir.Module.parse(kernel)
        assert split.chunks(1)[0].whole and not any(chunk.whole for chunk in split.chunks(3))
        alone, *rest = split.apart(sorted(split.kernels)[1:], 1)  # the step apart; one kernel linked elsewhere
        assert alone.public == ("_mlir_ciface_" + split.step_name,) and alone.step == split.step_name
        assert len(alone.calls) == 3 and not alone.kernels
        assert len(rest) == 1 and len(rest[0].kernels) == 2 and not rest[0].calls and not rest[0].whole
        assert sum(c.text.count("func.func @k") for c in [alone, *rest]) == 2
        for chunk in [alone, *rest]:
            ir.Module.parse(chunk.text)
        for chunks in (split.chunks(1), split.chunks(3)):
            assert sum(c.text.count("func.func @k") for c in chunks) == 3
            for chunk in chunks:
                ir.Module.parse(chunk.text)


def test_kernel_modules_apart_from_the_step_balance_with_the_step_beside_the_cheapest():
    """Kernels apart from the step go to modules of about equal cost with the step's cost counted
    in the last: the processor that builds the cheapest module builds the step next (an 8x64 Adam
    step's LLVM on the caller and a worker took 0.54 s instead of 0.70)."""
    kernels = {"ka": "a" * 100, "kb": "b" * 60, "kc": "c" * 40}
    split = kernel_split.Split("step", "s" * 50, kernels, {name: "" for name in kernels})
    step, *modules = split.apart(kernels, 2)
    assert step.step == "step" and not step.kernels
    assert [module.kernels for module in modules] == [("ka", "kc"), ("kb",)]  # 140 and 60 + 50, not 100 and 100 + 50
    assert [module.kernels for module in split.apart(["kb", "kc"], 2)] == [(), ("kb",), ("kc",)]
    costly = kernel_split.Split("step", "s" * 500, kernels, {name: "" for name in kernels})
    assert [module.kernels for module in costly.apart(["kb", "kc"], 2)] == [(), ("kb", "kc")]  # none empty


def test_views_of_one_buffer_are_not_marked_noalias_and_separate_buffers_are():
    with ir.Context():
        split = split_step(ir.Module.parse(STEP))
    (halves,) = _kernels_with(split, "memref.copy")
    (product,) = _kernels_with(split, "linalg.copy")
    assert NOALIAS not in halves
    assert f"{NOALIAS} = array<i64: 0, 1>" in product  # both buffers' pointers (static: no other argument)


# two sums over rows that start from one (CSE-shared) read of a zero vector
SHARED_READ = """
func.func @step(%x: memref<?x8xf64>, %zero: memref<8xf64>, %s: memref<8xf64>, %t: memref<8xf64>)
    attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %pad = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x8xf64>
  %start = vector.transfer_read %zero[%c0], %pad {in_bounds = [true]} : memref<8xf64>, vector<8xf64>
  %sum = scf.for %i = %c0 to %rows step %c1 iter_args(%acc = %start) -> (vector<8xf64>) {
    %row = vector.transfer_read %x[%i, %c0], %pad {in_bounds = [true]} : memref<?x8xf64>, vector<8xf64>
    %next = arith.addf %acc, %row : vector<8xf64>
    scf.yield %next : vector<8xf64>
  }
  vector.transfer_write %sum, %s[%c0] {in_bounds = [true]} : vector<8xf64>, memref<8xf64>
  %squares = scf.for %i = %c0 to %rows step %c1 iter_args(%acc = %start) -> (vector<8xf64>) {
    %row = vector.transfer_read %x[%i, %c0], %pad {in_bounds = [true]} : memref<?x8xf64>, vector<8xf64>
    %next = vector.fma %row, %row, %acc : vector<8xf64>
    scf.yield %next : vector<8xf64>
  }
  vector.transfer_write %squares, %t[%c0] {in_bounds = [true]} : vector<8xf64>, memref<8xf64>
  return
}
"""


def test_a_value_that_several_pieces_read_stays_in_the_step_and_each_piece_is_a_kernel():
    with ir.Context():
        split = split_step(ir.Module.parse(SHARED_READ))
    assert split.step.count("vector.transfer_read") == 1  # the shared read, where it was
    assert split.step.count("call @k") == 2 and "scf.for" not in split.step
    for kernel in split.kernels.values():
        assert kernel.count("scf.for") == 1
        assert "vector<8xf64>" in kernel.split("{")[0]  # the read's value is an argument
    tail = tail_pipeline(load_pipeline("cpu"))
    with tempfile.TemporaryDirectory() as folder:
        for i, chunk in enumerate(split.chunks(3)):  # each lowers and compiles on its own
            assert "llvm.func" in build(Job(chunk, tail, Path(folder) / f"{i}.o"))


def test_merged_llvm_text_has_each_definition_once_and_parses(monkeypatch):
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "0")  # one chunk: the step keeps its name
    graph = matmul_zoo(7, 13, "float32")
    kernel = compile_kernel(graph, use_disk=False)
    with ir.Context() as context:
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(kernel.stages["llvm"])
        names = [ir.StringAttr(op.attributes["sym_name"]).value for op in module.body.operations]
    assert len(names) == len(set(names)) and any(n.startswith("k") for n in names)
    text = merge_texts([kernel.stages["llvm"], kernel.stages["llvm"]])
    assert text.count(f"llvm.func internal @{symbol_name(graph)}(") == 1  # inlined into its C interface


def _check(graph, kernel) -> None:
    inputs, params = arguments(graph, 5, np.random.default_rng(0))
    want, want_params = evaluate(graph, inputs, [p.copy() for p in params], 5)
    got = CpuExecutable(graph, kernel).run(inputs, params)
    for g, w in zip(got + params, want + want_params):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5)


def test_workers_and_the_calling_process_build_the_same_step(monkeypatch):
    graph = matmul_zoo(33, 9, "float32")
    pipeline = load_pipeline("cpu")
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "2")
    kernel_pool.start()
    on_workers = compile_kernel(graph, pipeline, use_disk=False)
    _check(graph, on_workers)
    clear_memory_cache()
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "0")
    here = compile_kernel(graph, pipeline, use_disk=False)
    assert here.stages["llvm"].count("llvm.func @k") == on_workers.stages["llvm"].count("llvm.func @k")
    _check(graph, here)


def test_the_calling_process_builds_chunks_while_a_worker_does(monkeypatch, tmp_path):
    """One worker, three chunks: every object is built, the texts come back in order, and the
    caller built some (their objects are written before the worker's answer is read)."""
    graph = matmul_zoo(13, 7, "float32")
    *_, split, _ = lower_with_plan(graph, load_pipeline("cpu"))
    tail = tail_pipeline(load_pipeline("cpu"))
    chunks = split.apart(split.kernels, 2)
    assert len(chunks) == 3
    jobs = [Job(chunk, tail, tmp_path / f"chunk{i}.o") for i, chunk in enumerate(chunks)]
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "1")
    kernel_pool.start()
    built_here = []
    original = kernel_build.build

    def counted(job):
        built_here.append(job.path)
        return original(job)

    monkeypatch.setattr(kernel_build, "build", counted)
    texts = kernel_pool.run(jobs)
    assert all(job.path.stat().st_size > 0 for job in jobs)
    assert [chunk.public[0] in text for chunk, text in zip(chunks, texts)] == [True] * 3
    assert 1 <= len(built_here) <= 2


def test_an_interrupted_build_stops_the_busy_worker(monkeypatch, tmp_path):
    """A Ctrl-C while this process builds a chunk: the worker still building one is stopped,
    so that its answer is never read as a later compile's."""
    graph = matmul_zoo(7, 5, "float32")
    *_, split, _ = lower_with_plan(graph, load_pipeline("cpu"))
    chunks = split.apart(split.kernels, 1)
    jobs = [Job(chunk, tail_pipeline(load_pipeline("cpu")), tmp_path / f"chunk{i}.o") for i, chunk in enumerate(chunks)]
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "1")
    kernel_pool.start()
    worker = next(w for w in kernel_pool._WORKERS if w.alive())  # the one that gets a job
    original = kernel_build.build

    def interrupted(job):
        raise KeyboardInterrupt

    monkeypatch.setattr(kernel_build, "build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        kernel_pool.run(jobs)
    assert not worker.alive()
    monkeypatch.setattr(kernel_build, "build", original)
    kernel_pool.start()
    texts = kernel_pool.run(jobs)
    assert [chunk.public[0] in text for chunk, text in zip(chunks, texts)] == [True] * len(jobs)


def test_a_dead_worker_costs_only_time(monkeypatch):
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "2")
    kernel_pool.start()
    for worker in kernel_pool._WORKERS:
        worker.process.kill()
        worker.process.wait()
    clear_memory_cache()
    graph = matmul_zoo(5, 3, "float64")
    _check(graph, compile_kernel(graph, use_disk=False))


def test_a_bad_worker_count_names_the_variable(monkeypatch):
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "many")
    with pytest.raises(ValueError, match=kernel_pool.WORKERS_VARIABLE):
        kernel_pool.worker_count()


def test_a_pipeline_without_the_split_pass_is_lowered_whole():
    pipeline = load_pipeline("cpu")
    whole = type(pipeline)("whole", tuple(p for p in pipeline.passes if not p.startswith("scf-forall-to-parallel")))
    *_, split, _ = lower_with_plan(matmul_zoo(3, 2, "float32"), whole)
    assert split is None


def test_workers_by_default_on_the_cores_beyond_the_callers(monkeypatch):
    monkeypatch.delenv(kernel_pool.WORKERS_VARIABLE, raising=False)
    cores = sorted(os.sched_getaffinity(0))
    code = "import os, sys; os.sched_setaffinity(0, set(map(int, sys.argv[1:]))); " \
           "from mlir_nn.backends import kernel_pool; print(kernel_pool.worker_count())"
    root = str(Path(kernel_pool.__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    for allowed in ([cores[0]], cores[:2], cores):
        done = subprocess.run([sys.executable, "-c", code, *map(str, allowed)], capture_output=True, text=True,
                              check=True, env=env)
        assert int(done.stdout) == max(0, min(kernel_pool.MAX_WORKERS, len(allowed) - 1))


def test_the_step_is_inlined_into_its_c_interface_and_not_exported():
    """Only the step's C interface and its packed wrapper are exported: a public step got a
    wrapper of its own and was called with every memref's fields as arguments."""
    graph = matmul_zoo(7, 13, "float32")
    clear_memory_cache()
    kernel = compile_kernel(graph, use_disk=False)
    name = symbol_name(graph)
    library = kernel.native.owner
    assert not hasattr(library, name) and not hasattr(library, f"_mlir_{name}")
    assert hasattr(library, f"_mlir_ciface_{name}") and hasattr(library, f"_mlir__mlir_ciface_{name}")
    _check(graph, kernel)


# pieces whose buffers have dynamic sizes, strides and offsets, and two pieces that differ only
# in a static offset (the halves of %p and %q): kernels take a buffer as its pointer and the
# fields that its type leaves dynamic, the static ones are constants in the kernel
FIELDS = """
func.func @step(%x: memref<?x8xf32>, %y: memref<8x?xf32>, %p: memref<16xf32>, %q: memref<16xf32>, %r: memref<8xf32>)
    attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %two = arith.constant 2.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %last = arith.subi %rows, %c1 : index
  linalg.transpose ins(%x : memref<?x8xf32>) outs(%y : memref<8x?xf32>) permutation = [1, 0]
  %p0 = memref.subview %p[0] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1]>>
  %q0 = memref.subview %q[0] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1]>>
  %p1 = memref.subview %p[8] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1], offset: 8>>
  %q1 = memref.subview %q[8] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1], offset: 8>>
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      ins(%p0 : memref<8xf32, strided<[1]>>) outs(%q0 : memref<8xf32, strided<[1]>>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %two : f32
    linalg.yield %m : f32
  }
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      ins(%p1 : memref<8xf32, strided<[1], offset: 8>>) outs(%q1 : memref<8xf32, strided<[1], offset: 8>>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %two : f32
    linalg.yield %m : f32
  }
  %row = memref.subview %x[%last, 0] [1, 8] [1, 1] : memref<?x8xf32> to memref<8xf32, strided<[1], offset: ?>>
  memref.copy %row, %r : memref<8xf32, strided<[1], offset: ?>> to memref<8xf32>
  return
}
"""


@pytest.mark.parametrize("rows", [1, 7, 13, 257])
def test_kernels_take_pointers_and_dynamic_fields_and_pieces_of_other_offsets_stay_apart(rows):
    from mlir_nn.backends.memref_args import ArgumentBlock
    from mlir_nn.backends.native import link_objects, load_shared_object

    with ir.Context():
        split = split_step(ir.Module.parse(FIELDS))
    halves = _kernels_with(split, "arith.mulf")
    assert len(halves) == 2 and len(split.kernels) == 4  # the halves differ in their offset only
    (transpose,) = _kernels_with(split, "linalg.transpose")
    assert transpose.startswith(f"func.func @{next(n for n, k in split.kernels.items() if k == transpose)}("
                                "%mlirnn_p0: !llvm.ptr, %mlirnn_f0_0: i64, %mlirnn_p1: !llvm.ptr, %mlirnn_f1_0: i64, "
                                "%mlirnn_f1_1: i64)")  # x: its rows; y: its columns and its row stride
    rng = np.random.default_rng(rows)
    x, p = rng.standard_normal((rows, 8)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    y, q, r = np.zeros((8, rows), np.float32), np.zeros(16, np.float32), np.zeros(8, np.float32)
    with tempfile.TemporaryDirectory() as folder:
        objects = []
        for i, chunk in enumerate(split.chunks(1) if rows % 2 else split.chunks(3)):  # whole, and apart
            objects.append(Path(folder) / f"{i}.o")
            build(Job(chunk, tail_pipeline(load_pipeline("cpu")), objects[-1]))
        link_objects(objects, Path(folder) / "step.so")
        native = load_shared_object(Path(folder) / "step.so", "step")
    block = ArgumentBlock([2, 2, 1, 1, 1])
    for i, array in enumerate((x, y, p, q, r)):
        block.bind(i, array)
    native.call(block.address)
    np.testing.assert_array_equal(y, x.T)
    np.testing.assert_array_equal(q, 2 * p)
    np.testing.assert_array_equal(r, x[-1])


def _every_operand_read(piece: list[ir.Operation]) -> list[tuple[ir.Operation, int, ir.Value]]:
    """Where ``piece`` reads values defined outside it, by reading every operand of every op
    (walk order, operand order): what ``_outside_reads`` must find from the values' uses."""
    nested: list[ir.Operation] = []
    for op in piece:
        op.walk(lambda inner: nested.append(inner) or ir.WalkResult.ADVANCE)
    inside = set(nested)
    reads = []
    for inner in nested:
        for k, value in enumerate(inner.operands):
            owner = value.owner
            defined = owner.operation if isinstance(owner, ir.OpView | ir.Operation) else owner.owner.operation
            if defined not in inside:
                reads.append((inner, k, value))
    return reads


def _mlp_step(sizes: list[int], batch: int):
    from mlir_nn.jit import trace_step
    from mlir_nn.losses import mse_loss
    from mlir_nn.nn import MLP
    from mlir_nn.optim import Adam
    from mlir_nn.trainer import train_step

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    model = MLP(sizes[0], sizes[1:])
    graph, _, _ = trace_step(train_step(model, Adam(model.parameters(), lr=1e-3), mse_loss), [x, y], ["x", "y"])
    return graph


@pytest.mark.parametrize("batch", [1, 7, 13])
def test_outside_reads_from_uses_are_the_reads_of_every_operand(monkeypatch, batch):
    found = kernel_split._outside_reads
    compared = []

    def checked(fn, block, pieces):
        reads = found(fn, block, pieces)
        for piece, got in zip(pieces, reads, strict=True):
            assert got == _every_operand_read(piece)
        compared.append(len(pieces))
        return reads

    monkeypatch.setattr(kernel_split, "_outside_reads", checked)
    lower_with_plan(_mlp_step([33, 13, 13, 7], batch), load_pipeline("cpu"))
    assert len(compared) == 2 and all(compared)  # the step's entry block and its input guard's body
    for text in (STEP, SHARED_READ):
        with ir.Context():
            split_step(ir.Module.parse(text))


def test_repeated_layers_are_one_kernel_each_and_compute_the_reference(monkeypatch):
    graph = _mlp_step([32] * 7 + [5], 13)
    split = lower_with_plan(graph, load_pipeline("cpu"))[4]
    assert split.step.count("call @k") >= 3 * len(split.kernels)  # 6 identical hidden layers
    import mlir_nn
    from mlir_nn.losses import mse_loss
    from mlir_nn.nn import MLP
    from mlir_nn.optim import Adam
    from mlir_nn.trainer import train_step

    monkeypatch.setenv("MLIR_NN_TIERED", "0")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((13, 32)).astype(np.float32)
    y = rng.standard_normal((13, 5)).astype(np.float32)
    results = []
    for backend in ("cpu", "numpy"):
        mlir_nn.manual_seed(0)
        model = MLP(32, [32] * 6 + [5])
        step = mlir_nn.jit(train_step(model, Adam(model.parameters(), lr=1e-2), mse_loss), backend=backend)
        losses = [float(np.asarray(step(x, y))) for _ in range(3)]
        results.append((losses, [p.data.copy() for p in model.parameters()]))
    (got, got_params), (want, want_params) = results
    np.testing.assert_allclose(got, want, rtol=1e-4)
    for g, w in zip(got_params, want_params, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_pieces_differing_only_in_a_shape_are_distinct_kernels():
    head, start, tail = STEP.rpartition("%b = ")
    wider = head + start + tail.replace("4x8xf32", "4x9xf32")  # the second fill one column wider
    with ir.Context():
        split = split_step(ir.Module.parse(wider))
    fills = _kernels_with(split, "linalg.fill")
    assert len(fills) == 2 and len(split.kernels) == 4 and split.step.count("call @k") == 4
    assert {"4x8xf32" in f for f in fills} == {True, False}


# a run-time choice made in scalar arithmetic at the step's top level (an i1 compare, a select of
# it, casts) between pieces of work, and a load whose value scalar arithmetic scales for a fill:
# the compare used to be work whose reader (the index select) stays, so its piece never closed and
# every op after it stayed in the step, run serially
CHOICE = """
func.func @step(%x: memref<?x8xf32>, %y: memref<?x8xf32>, %p: memref<16xf32>, %q: memref<16xf32>,
    %r: memref<8xf32>, %s: memref<8xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %c10 = arith.constant 10 : i64
  %two = arith.constant 2.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  linalg.copy ins(%x : memref<?x8xf32>) outs(%y : memref<?x8xf32>)
  %many = arith.cmpi uge, %rows, %c4 : index
  %wide = arith.index_cast %rows : index to i64
  %big = arith.cmpi sgt, %wide, %c10 : i64
  %both = arith.andi %many, %big : i1
  %half = arith.select %both, %c8, %c4 : index
  %count = arith.index_cast %rows : index to i32
  %scale = arith.uitofp %count : i32 to f32
  %lo = memref.subview %p[0] [%half] [1] : memref<16xf32> to memref<?xf32, strided<[1]>>
  %qlo = memref.subview %q[0] [%half] [1] : memref<16xf32> to memref<?xf32, strided<[1]>>
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      ins(%lo : memref<?xf32, strided<[1]>>) outs(%qlo : memref<?xf32, strided<[1]>>) {
  ^bb0(%a: f32, %b: f32):
    %m = arith.mulf %a, %scale : f32
    linalg.yield %m : f32
  }
  linalg.fill ins(%two : f32) outs(%r : memref<8xf32>)
  %first = memref.load %p[%c0] : memref<16xf32>
  %twice = arith.mulf %first, %two : f32
  linalg.fill ins(%twice : f32) outs(%s : memref<8xf32>)
  return
}
"""


@pytest.mark.parametrize("rows", [1, 7, 13, 33, 257])
def test_scalar_arithmetic_at_the_top_level_stays_in_the_step_and_later_work_is_in_kernels(rows):
    """The compares, select and integer casts stay in the step like index arithmetic: the work
    after them is in kernels, not inline in the step; a scalar op that reads a piece's value (the
    scaled load) or has a float result goes into the piece that reads it. Compiled, it computes
    what numpy does."""
    from mlir_nn.backends.memref_args import ArgumentBlock
    from mlir_nn.backends.native import link_objects, load_shared_object

    with ir.Context():
        split = split_step(ir.Module.parse(CHOICE))
    assert "linalg." not in split.step and "memref.load" not in split.step
    assert split.step.count("call @k") == 4 and len(split.kernels) == 4
    assert "arith.cmpi" in split.step and "arith.select" in split.step and "arith.index_cast" in split.step
    (scaled,) = _kernels_with(split, "arith.uitofp")  # a float result goes into the piece that reads it
    assert "linalg.generic" in scaled
    (loaded,) = _kernels_with(split, "memref.load")
    assert "arith.mulf" in loaded and "linalg.fill" in loaded
    rng = np.random.default_rng(rows)
    x, p = rng.standard_normal((rows, 8)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    y, q = np.zeros((rows, 8), np.float32), np.zeros(16, np.float32)
    r, s = np.zeros(8, np.float32), np.zeros(8, np.float32)
    with tempfile.TemporaryDirectory() as folder:
        objects = []
        for i, chunk in enumerate(split.chunks(1) if rows % 2 else split.chunks(3)):
            objects.append(Path(folder) / f"{i}.o")
            build(Job(chunk, tail_pipeline(load_pipeline("cpu")), objects[-1]))
        link_objects(objects, Path(folder) / "step.so")
        native = load_shared_object(Path(folder) / "step.so", "step")
    block = ArgumentBlock([2, 2, 1, 1, 1, 1])
    for i, array in enumerate((x, y, p, q, r, s)):
        block.bind(i, array)
    native.call(block.address)
    half = 8 if rows > 10 else 4
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(q[:half], p[:half] * np.float32(rows))
    np.testing.assert_array_equal(q[half:], 0)
    np.testing.assert_array_equal(r, np.full(8, 2, np.float32))
    np.testing.assert_array_equal(s, np.full(8, 2 * p[0], np.float32))


def test_a_step_output_computed_as_a_scalar_closes_its_piece_where_it_is_computed():
    """The loss of an optimized SGD step is a 0-d result that host code computes in the step's
    body (``codegen.builder.Scalar``): stored where it is computed, not at the return, so that
    the piece that computes it does not reach across the whole backward (one kernel of 58% of
    the step's kernel code, a 784-1024-1024-10 step 8% slower)."""
    from mlir_nn.egraph.cache import optimize_cached
    from mlir_nn.jit import trace_step
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((13, 33)).astype(np.float32), rng.standard_normal((13, 7)).astype(np.float32)
    model = MLP(33, [64, 64, 7])
    graph = trace_step(train_step(model, SGD(model.parameters(), lr=1e-3)), [x, y], ["x", "y"])[0]
    split = lower_with_plan(optimize_cached(graph, 13)[0], load_pipeline("cpu"))[4]
    sizes = [len(text) for text in split.kernels.values()]
    assert max(sizes) < 0.3 * sum(sizes)
