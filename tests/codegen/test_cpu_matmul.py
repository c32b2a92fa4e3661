"""The GotoBLAS-style CPU products (packed panels, kc slices, register blocks) at awkward sizes.

Every product of ``matmul_zoo`` (all transpose combinations, read-through transposes,
bias + ReLU, the folded update, the ReLU-grad mask) against the reference backend, with
row counts that leave partial register blocks (1, 7, 13, 33, 257 rows), column counts
that leave a zero-padded panel, and k not a multiple of kc (also the batch as k).
Tolerances as in tests/backends/test_cpu_parallel.py.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends.cpu import CpuBackend, CpuExecutable, compile_kernel, lower
from mlir_nn.backends.reference import evaluate
from mlir_nn.backends.thread_pool import ENV as NUM_THREADS_ENV
from mlir_nn.codegen import cpu_matmul, emit_linalg
from mlir_nn.codegen.batch_split import TASKS_MAX
from mlir_nn.codegen.cpu_matmul import (
    FINE_TASK_SHARE,
    IN_PLACE_SHORT_COLUMNS_MAX,
    IN_PLACE_STRIDE_MAX,
    K_RANGES_OUTPUT_MAX,
    K_RANGES_PARTIALS_BYTES,
    K_UNROLL,
    NARROW_ROW_BLOCK,
    NARROW_ROW_VECTORS,
    NARROW_ROWS_MIN,
    PACK,
    PACK_ROWS_STEP,
    PACK_TASK_ROWS,
    PADDED_ROWS,
    QUICK_SMALL_K_STEP,
    SMALL_CARRY_MAX,
    SMALL_CHUNK_TASK_MIN,
    SMALL_K_STEP,
    SMALL_K_STEPS,
    SMALL_ROW_BLOCK,
    SMALL_VECTOR_MAX,
    STRIDED_COLUMNS_KC,
    STRIDED_COLUMNS_ROWS_MAX,
    TRANSPOSE_TILE,
    _even_block_rows,
    _lane_split,
    balanced_tasks,
    block_columns,
    loop_plan,
    product_plan,
    rewrite_matmuls,
    small_block_rows,
)
from mlir_nn.codegen.row_pitch import ALIASED_PITCH
from mlir_nn.codegen.schedule_report import product_schedules
from mlir_nn.codegen.short_products import SHORT_K
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.cpu_target import (
    PLANNED_TARGET_ENV,
    cache_blocks,
    deep_kc,
    in_place_kc,
    register_block,
    vector_bytes,
)
from mlir_nn.support.pipelines import Pipeline, load_pipeline
from mlir_nn.support.schedule_rates import DEFAULT, active, use_rates
from tests.codegen.zoo import arguments, matmul_zoo
from tests.conftest import replan

pytestmark = pytest.mark.usefixtures("planned_for_the_schedule_tests")  # (tests/conftest.py)

TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float64": dict(rtol=1e-9, atol=1e-11)}
BATCHES = (1, 7, 13, 33, 257)
# Tables that keep a product off the loop nests or off the blocked schedules, for the tests of one
# schedule's code at shapes where the default table would choose another.
NO_LOOPS = dataclasses.replace(DEFAULT, plain_loops=1e-9, batch_sums=1e-9, small_rows=(1e-9,) * 3)
NO_BLOCKS = dataclasses.replace(DEFAULT, blocked=1e-9, swapped=1e-9)


def _assert_matches_reference(graph: Graph, executable: CpuExecutable, batches: tuple[int, ...], dtype: str = "float32",
                              lr_slot: int | None = None, updated_slot: int | None = None) -> None:
    """Every output at each batch against the reference, and the updated parameter (written
    in place: the array passed in holds the new value); ``lr_slot``: a 0-d parameter set to 0.05."""
    for batch in batches:
        inputs, params = arguments(graph, batch, np.random.default_rng(batch))
        if lr_slot is not None:
            params[lr_slot] = np.array(0.05, dtype)
        want, updates = evaluate(graph, inputs, [p.copy() for p in params], batch)
        got = executable.run(inputs, params)
        if updated_slot is not None:
            np.testing.assert_allclose(params[updated_slot], updates[0], **TOL[dtype], err_msg=f"update, batch {batch}")
        for node, value, expected in zip(graph.outputs, got, want):
            assert value.shape == expected.shape and value.dtype == expected.dtype, node
            message = f"{node.op} {dict(node.attrs)} batch {batch}"
            np.testing.assert_allclose(value, expected, **TOL[dtype], err_msg=message)


@pytest.mark.parametrize("k, m, dtype", [
    (257, 33, "float32"),  # k = kc + 1; 33 columns: two whole panels and a padded one
    (17, 257, "float32"),  # short k; 257 columns
    (600, 7, "float32"),  # k over three kc slices; fewer columns than one panel
    (33, 257, "float64"),
])
def test_blocked_products_match_the_reference_at_awkward_sizes(k, m, dtype):
    graph = matmul_zoo(k, m, dtype)
    executable = CpuBackend().compile(graph)
    text = executable.stages["llvm"]
    assert "llvm.intr.fmuladd" in text or "llvm.intr.fma" in text
    assert "memrefCopy" not in text  # strided copies became loops, not per-element runtime calls
    _assert_matches_reference(graph, executable, BATCHES, dtype)


@pytest.mark.parametrize("k, m, dtype", [(32, 32, "float32"), (64, 32, "float32"), (7, 13, "float32"),
                                         (1, 33, "float32"), (13, 1, "float32"), (9, 5, "float64")])
def test_small_products_are_vector_code_and_match_the_reference(k, m, dtype):
    graph = matmul_zoo(k, m, dtype)
    module = emit_linalg(graph)
    assert rewrite_matmuls(module)[0] == 0  # all loop kernels: too little static work to pack
    text = str(module)
    assert "vector.fma" in text and "vector.contract" not in text  # FMAs on vector registers
    # over the batch: blocks of rows (a vector per block); k over SHORT_K (else one pass with an
    # epilogue): the batch's rows as tasks on threads (x @ w, g @ w^T, both linear ops, the
    # ReLU-grad product), and the sums over the batch with large accumulators in partial sums of
    # batch ranges (x^T g, (x^T)^T g, both gemms)
    assert f"vector<{SMALL_ROW_BLOCK}x" in text
    assert text.count("= scf.forall") == (5 + (4 if k * m > SMALL_CARRY_MAX else 0) if k >= SHORT_K else 0)
    # rows: no whole block, one, many, a partial last one, several tasks
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (SMALL_ROW_BLOCK, 4099), dtype)


def _lane_parts(size: int, dtype: str) -> tuple[int, ...]:
    """The widths of vector code over rows of ``size`` elements: one, or two parts (``_lane_split``)."""
    point = _lane_split(size, vector_bytes() // np.dtype(dtype).itemsize)
    return (size,) if point is None else (point, size - point)


def _product_graph(k: int, m: int, dtype: str) -> Graph:
    """x @ w over the batch, x: (N, k), w: (k, m): the output layer of an MLP."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    w = make_node("param", [], name="w", shape=(k, m), dtype=dtype)
    return Graph((x,), (w,), (make_node("matmul", [x, w]),), name="output_layer")


@pytest.mark.parametrize("k, m, dtype", [(256, 10, "float32"), (48, 7, "float64")])
def test_small_rows_with_a_long_k_loop_over_k_in_steps(k, m, dtype):
    """x @ w over the batch with a long static k: each block of rows (and each row of the last
    partial block) loops over k in steps of SMALL_K_STEP, its accumulators carried in vector
    registers through that loop, instead of k unrolled whole (1280 FMAs for k = 256 took LLVM
    about a second to compile). Rows of NARROW_ROW_VECTORS vector registers or fewer run in
    blocks of NARROW_ROW_BLOCK rows where there are 32 registers (AVX-512), else of SMALL_ROW_BLOCK."""
    graph = _product_graph(k, m, dtype)
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=False)
    text = str(module)
    element = "f32" if dtype == "float32" else "f64"
    block = NARROW_ROW_BLOCK if vector_bytes() == 64 else SMALL_ROW_BLOCK
    assert small_block_rows((0, 2, 1), m, np.dtype(dtype).itemsize) == block
    loop = rf"scf.for %\w+ = %c0 to %c{k} step %c{SMALL_K_STEP} iter_args\(.*\) -> \(vector<(\d+)x{m}x{element}>\)"
    steps = re.findall(loop, text)
    assert sorted(map(int, steps)) == [1, block], steps  # the whole blocks' loop and the rest's
    assert text.count("vector.fma") == (block + 1) * SMALL_K_STEP
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (block, block + 3, 4099), dtype)


@pytest.mark.parametrize("m", [48, 64])
def test_narrow_rows_run_in_blocks_of_more_rows_with_avx512(m):
    """x @ w over the batch, w 64 x m float32: rows of 48 (split 32 + 16 inside each block) run in
    blocks of NARROW_ROW_BLOCK rows with AVX-512, so that the one-register part has 8 FMA chains;
    rows of 64 (4 registers: 32 accumulators in such blocks) in blocks of SMALL_ROW_BLOCK. Both
    match the reference at awkward batches."""
    if vector_bytes() != 64:
        pytest.skip("blocks of NARROW_ROW_BLOCK rows need 32 vector registers (AVX-512)")
    graph = _product_graph(64, m, "float32")
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=False)
    text = str(module)
    narrow = m * 4 <= NARROW_ROW_VECTORS * vector_bytes()
    block = NARROW_ROW_BLOCK if narrow else SMALL_ROW_BLOCK
    widths = _lane_parts(m, "float32")
    assert len(widths) == (2 if narrow else 1)
    for width in widths:
        assert f"vector<{block}x{width}xf32>" in text, (block, width)
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (block, block + 3, 4099), "float32")


@pytest.mark.parametrize("k, m, dtype", [(256, 10, "float32"), (48, 7, "float64")])
def test_the_quick_schedule_steps_over_k_in_shorter_steps(k, m, dtype):
    """``quick`` (the quick tier's code, LLVM at -O0): the same loops over k in steps of
    QUICK_SMALL_K_STEP, fewer FMAs for LLVM to compile; the code still computes the product."""
    graph = _product_graph(k, m, dtype)
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=False, quick=True)
    text = str(module)
    element = "f32" if dtype == "float32" else "f64"
    step = QUICK_SMALL_K_STEP
    loop = rf"scf.for %\w+ = %c0 to %c{k} step %c{step} iter_args\(.*\) -> \(vector<(\d+)x{m}x{element}>\)"
    block = small_block_rows((0, 2, 1), m, np.dtype(dtype).itemsize)
    assert sorted(map(int, re.findall(loop, text))) == [1, block]
    assert text.count("vector.fma") == (block + 1) * QUICK_SMALL_K_STEP < (block + 1) * SMALL_K_STEP
    executable = CpuExecutable(graph, compile_kernel(graph, use_disk=False, threads=False, opt_level=0))
    _assert_matches_reference(graph, executable, BATCHES + (block, 4099), dtype)


def test_the_quick_schedule_does_not_unroll_the_blocked_k_loop():
    """The blocked products' kc slices: the k loop unrolled K_UNROLL times, K_UNROLL - 1 register
    kernels (an FMA per row of accumulators) more than the quick schedule's, whose loop is not."""
    def kernel_fmas(quick: bool) -> list[int]:
        module = emit_linalg(matmul_zoo(257, 33, "float32"))
        assert rewrite_matmuls(module, threads=False, quick=quick)[0]
        slices = collect_ops(module, lambda op: op.name == "scf.for" and "mlirnn.kc_loop" in op.attributes)
        return [str(op).count("vector.fma") for op in slices]

    unrolled, quick = kernel_fmas(False), kernel_fmas(True)
    assert quick and len(unrolled) == len(quick)
    assert all(u - q == (K_UNROLL - 1) * register_block(4)[0] for u, q in zip(unrolled, quick))


@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("graph", ["update", "zoo"])
def test_every_blocked_k_loop_is_unrolled(graph, threads):
    """Every kc slice's k loop is unrolled K_UNROLL times, on threads too: the loops the schedule
    unrolls are found again after the accumulators are hoisted (the SGD-fused weight gradient's
    loops on threads, replaced by the hoisting, kept one register kernel per iteration through a
    stale handle)."""
    built = _update_graph(96, 1024, False) if graph == "update" else matmul_zoo(257, 33, "float32")
    module = emit_linalg(built)
    assert rewrite_matmuls(module, threads=threads)[0]
    slices = collect_ops(module, lambda op: op.name == "scf.for" and "mlirnn.kc_loop" in op.attributes)
    assert slices and all(str(op).count("vector.fma") >= K_UNROLL * register_block(4)[0] for op in slices)


@pytest.mark.parametrize("k, m, dtype", [(64, 64, "float32"), (128, 32, "float32"), (128, 32, "float64")])
def test_batch_products_with_a_small_b_are_vector_code(k, m, dtype):
    """x @ w, g @ w^T and x @ w + b over the batch with w of SMALL_VECTOR_MAX elements: vector
    code per block of rows (on threads in tasks of rows), not packed, when a row of the result
    fills 2 to 4 vector registers (packing all of the batch's rows cost more than the register
    blocks gained); wider rows stay blocked (a block's accumulators would spill)."""
    def kind(n: int) -> str:
        return "small-rows" if 2 * vector_bytes() <= n * np.dtype(dtype).itemsize <= 4 * vector_bytes() else "blocked"

    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", m), dtype=dtype)
    w = make_node("param", [], name="w", shape=(k, m), dtype=dtype)
    bias = make_node("param", [], name="bias", shape=(m,), dtype=dtype)
    outs = (make_node("matmul", [x, w]), make_node("matmul", [g, w], transpose_b=True),
            make_node("linear", [x, w, bias], activation="relu"))
    graph = Graph((x, g), (w, bias), outs, name="small_b")
    assert k * m == SMALL_VECTOR_MAX
    module = emit_linalg(graph)
    with module.context:
        kinds = [product_plan(op, threads=True).kind for op in collect_ops(module, lambda o: o.name == "linalg.matmul")]
    expected = [kind(m), kind(k), kind(m)]
    if "small-rows" not in expected:
        pytest.skip("no row of 2 to 4 vector registers on this host")
    assert kinds == expected
    assert rewrite_matmuls(module)[0] == expected.count("blocked")
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (SMALL_ROW_BLOCK, 4099), dtype)


@pytest.mark.parametrize("k, m, dtype", [(1000, 10, "float32"), (520, 7, "float32"), (1024, 3, "float64")])
def test_narrow_products_over_the_batch_are_vector_code_and_match_the_reference(k, m, dtype):
    """Over the batch with a side narrower than a vector (an output layer of m classes over a
    long k): x @ w and x @ v^T in steps of k, the weight gradients x^T g and g^T x (both layouts:
    the latter as its transpose) in equal chunks of the long side, on threads when a batch row
    has enough work; none is packed (blocked, each packed a copy of all of x), and every one
    matches the reference."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", m), dtype=dtype)
    w = make_node("param", [], name="w", shape=(k, m), dtype=dtype)
    v = make_node("param", [], name="v", shape=(m, k), dtype=dtype)
    outs = (make_node("matmul", [x, w]), make_node("matmul", [x, v], transpose_b=True),
            make_node("matmul", [x, g], transpose_a=True), make_node("matmul", [g, x], transpose_a=True))
    graph = Graph((x, g), (w, v), outs, name="narrow_layer")
    module = emit_linalg(graph)
    with module.context:
        plans = [product_plan(op, threads=True) for op in collect_ops(module, lambda o: o.name == "linalg.matmul")]
    assert [p.kind for p in plans] == ["small-rows"] * 4, plans
    assert all(SMALL_K_STEPS in p.loops.tags for p in plans[:2])
    assert [p.loops.swapped for p in plans[2:]] == [False, True]
    assert all(p.loops.chunk and p.loops.chunk_tasks == (k * m >= SMALL_CHUNK_TASK_MIN) for p in plans[2:])
    assert rewrite_matmuls(module)[0] == 0
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (SMALL_ROW_BLOCK, 4099), dtype)


@pytest.mark.parametrize("size, lanes, point", [(20, 16, 16), (24, 16, 16), (48, 16, 32), (40, 16, 32), (12, 8, 8),
                                               (32, 16, None), (64, 16, None), (16, 16, None), (10, 16, None),
                                               (100, 16, None), (257, 16, None)])
def test_vector_rows_split_after_a_power_of_two_of_registers(size, lanes, point):
    assert _lane_split(size, lanes) == point


@pytest.mark.parametrize("k, m, dtype", [(20, 20, "float32"), (48, 48, "float32"), (24, 12, "float64")])
def test_small_products_with_rows_of_no_power_of_two_of_registers_run_in_two_parts(k, m, dtype, monkeypatch):
    """Every small product of the zoo whose vector rows (m or k floats) are longer than a
    register but not a power of two of them is split in two along them, each part's FMAs on
    whole registers or a power of two of lanes (LLVM widened 20-, 24- and 48-float vectors and
    shuffled their pieces: x @ w over 50000 rows at 48 x 48, one core, 9.0 -> 3.2 ms); those whose
    rows are the batch (x @ w) in each block of rows, so that both parts read the block's rows of
    x; weight gradients summed in chunks of their accumulator (x^T g) in each chunk, so that the
    second part reads the chunk's columns of x from cache. Every output matches the reference."""
    parts = _lane_parts(m, dtype)
    if len(parts) == 1:
        pytest.skip(f"rows of {m} elements are a power of two of registers on this host")
    graph = matmul_zoo(k, m, dtype)
    module = emit_linalg(graph)
    found, tagged = cpu_matmul._schedule_tags, []
    monkeypatch.setattr(cpu_matmul, "_schedule_tags", lambda module: tagged.append(found(module)) or tagged[-1])
    assert rewrite_matmuls(module)[0] == 0
    assert tagged[0].block_splits == tagged[0].chunk_splits == {(2, parts[0])}
    element = "f32" if dtype == "float32" else "f64"
    widths = {int(w) for w in re.findall(rf"vector.fma .*: vector<(\d+)x{element}>", str(module))}
    assert widths == set(parts), widths
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (SMALL_ROW_BLOCK, 4099), dtype)


def test_only_a_k_in_whole_steps_loops_over_k():
    """k not a multiple of SMALL_K_STEP (the steps would be partial) or no longer than one step
    stays unrolled."""
    def tags(k: int) -> tuple[str, ...]:
        module = emit_linalg(_product_graph(k, 10, "float32"))
        op = collect_ops(module, lambda o: o.name == "linalg.matmul")[0]
        with module.context:
            return loop_plan(op, threads=False).tags

    assert SMALL_K_STEPS in tags(4 * SMALL_K_STEP)
    assert SMALL_K_STEPS not in tags(4 * SMALL_K_STEP + 1) and SMALL_K_STEPS not in tags(SMALL_K_STEP)


@pytest.mark.parametrize("k, m, dtype", [(100, 13, "float32"), (40, 33, "float64"),
                                         (101, 13, "float32")])  # 101 rows: no equal chunks, separate products
def test_batch_sums_with_a_large_accumulator_run_in_chunks_and_match_the_reference(k, m, dtype):
    """A product summed over the batch (x^T g) whose (k, m) accumulator would be carried whole
    through the batch loop is split into chunks of its rows, each at most SMALL_CARRY_MAX."""
    graph = matmul_zoo(k, m, dtype)
    module = emit_linalg(graph)
    with use_rates(NO_BLOCKS):  # 33 float64 columns are ragged rows: blocked by default
        assert rewrite_matmuls(module)[0] == 0
    element = "f32" if dtype == "float32" else "f64"
    widths = "|".join(map(str, _lane_parts(m, dtype)))
    rows = {int(r) for r in re.findall(rf"vector<(\d+)x(?:{widths})x{element}>", str(module))}
    # a chunk of x^T g's rows (k of them); SMALL_K_STEP rows are x @ w's steps over the rows of w
    chunks = sorted(r for r in rows if SMALL_ROW_BLOCK < r < k and r != SMALL_K_STEP)
    assert chunks and max(chunks) * m <= SMALL_CARRY_MAX, rows
    with use_rates(NO_BLOCKS):
        executable = CpuBackend().compile(graph)
    _assert_matches_reference(graph, executable, BATCHES + (SMALL_ROW_BLOCK,), dtype)


@pytest.mark.parametrize("k, m, dtype, chunk", [(256, 10, "float32", 16), (40, 32, "float64", 8)])
def test_equal_chunks_of_a_batch_sum_are_one_loop(k, m, dtype, chunk):
    """x^T g over the batch, its rows in equal chunks (a divisor of k): one loop over the
    chunks with the batch loop inside, its body compiled once (not one product per chunk: ten
    kernels for 256 x 10), each chunk's accumulator carried in registers through the batch."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", m), dtype=dtype)
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weight_gradient")
    module = emit_linalg(graph)
    with module.context:
        plan = loop_plan(collect_ops(module, lambda o: o.name == "linalg.matmul")[0], threads=False)
    assert plan.chunk == chunk and plan.chunks is None and chunk * m <= SMALL_CARRY_MAX
    rewrite_matmuls(module, threads=False)
    text = str(module)
    element = "f32" if dtype == "float32" else "f64"
    parts = _lane_parts(m, dtype)  # (rows split in two where they are no power of two of registers)
    assert len(re.findall(rf"scf.for %\w+ = %c0 to %c{k} step %c{chunk} ", text)) == len(parts)
    for width in parts:  # the blocks' loop, the rest's, and the chunk loop
        assert len(re.findall(rf"iter_args\(.*\) -> \(vector<{chunk}x{width}x{element}>\)", text)) == 3
    assert text.count("vector.fma") == (SMALL_ROW_BLOCK + 1) * chunk * len(parts)
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (SMALL_ROW_BLOCK,), dtype)


def _width_one_graph(k: int, dtype: str) -> Graph:
    """The products of a width-1 output layer over the batch: x @ w, x @ w + b, the weight
    gradient x^T g and the update c <- c - lr * x^T g in place (x: (N, k), g: (N, 1))."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", 1), dtype=dtype)
    w = make_node("param", [], name="w", shape=(k, 1), dtype=dtype)
    bias = make_node("param", [], name="bias", shape=(1,), dtype=dtype)
    c = make_node("param", [], name="c", shape=(k, 1), dtype=dtype)
    lr = make_node("param", [], name="lr", shape=(), dtype=dtype)
    one = make_node("const", [], value=1.0, dtype=dtype)
    outs = (make_node("matmul", [x, w]), make_node("linear", [x, w, bias]),
            make_node("matmul", [x, g], transpose_a=True))
    update = make_node("gemm", [x, g, c, lr, one], transpose_a=True, subtract=True)
    return Graph((x, g), (w, bias, c, lr), outs, updates=(("c", update),), name="width_one")


@pytest.mark.parametrize("k, dtype", [(64, "float32"), (13, "float32"), (512, "float32"), (257, "float32"),
                                      (600, "float64")])
def test_width_one_products_keep_the_unit_column_out_of_vectors(k, dtype):
    """A product with one column never has it as the vector's inner dim (vectors of [..., 1]
    were one scalar FMA per lane): x @ w is a dot product per row (a loop LLVM vectorizes),
    x^T g runs as the row g^T x (chunks of at most SMALL_CARRY_MAX when k is longer)."""
    graph = _width_one_graph(k, dtype)
    module = emit_linalg(graph)
    with module.context:
        plans = [loop_plan(op, threads=False) for op in collect_ops(module, lambda o: o.name == "linalg.matmul")]
    assert [p.swapped for p in plans] == [False, False, True, True]
    assert [p.tags for p in plans[:2]] == [(), ()]
    rewrite_matmuls(module, threads=False)
    element = "f32" if dtype == "float32" else "f64"
    carried = re.findall(rf"iter_args\(.*\) -> \(vector<([\dx]+)x{element}>\)", str(module))
    assert carried and all(shape.startswith("1x") for shape in carried), carried  # g^T x's accumulator rows
    assert max(int(shape[2:]) for shape in carried) <= min(k, SMALL_CARRY_MAX), carried
    executable = CpuBackend().compile(graph)
    fmas = re.findall(r"llvm.intr.fmuladd\(.*\) : \((\w+|vector<\d+x\w+>),", executable.stages["llvm"])
    assert fmas and not [t for t in fmas if t in ("f32", "f64") or t.startswith("vector<1x")], fmas  # no scalar FMAs
    _assert_matches_reference(graph, executable, BATCHES + (SMALL_ROW_BLOCK, 4099), dtype, lr_slot=3, updated_slot=2)


@pytest.mark.parametrize("k, m, dtype, swapped", [
    (4100, 1, "float32", True),  # one column, k over many kc slices; g @ w^T has k = 1 (once failed to compile)
    (601, 10, "float32", True),  # an output layer of 10 classes; k over three kc slices, not in whole steps
    (257, 13, "float32", None),  # swapped with AVX-512 (13 of 32 columns), not with AVX2 (13 of 16)
    (1401, 3, "float64", True),
])
def test_products_with_few_columns_run_swapped_and_match_the_reference(k, m, dtype, swapped):
    """A product with fewer columns than a register block's runs as C^T = op(B)^T op(A)^T (its
    rows become the block's columns) and is transposed back; every op of the zoo at every
    batch matches the reference. Loop nests are kept out: by default x @ w with one column is a
    dot product per row (3000 rows of 4100: 2.9 ms, swapped 10.3, one core)."""
    graph = matmul_zoo(k, m, dtype)
    module = emit_linalg(graph)
    with use_rates(NO_LOOPS):
        rewrite_matmuls(module)
        executable = CpuBackend().compile(graph)
    _, tn = register_block(np.dtype(dtype).itemsize)
    batch_columns = f"x?x{tn}x{'f32' if dtype == 'float32' else 'f64'}>"  # x @ w: the batch in column panels
    if swapped is not None:
        assert (batch_columns in str(module)) == swapped
    _assert_matches_reference(graph, executable, BATCHES, dtype)


@pytest.mark.parametrize("rows, tm, block", [(10, 12, 10), (12, 12, 12), (16, 12, 8), (13, 12, 7), (25, 12, 9),
                                              (100, 12, 12), (16, 6, 6), (7, 4, 4)])
def test_static_rows_are_spread_evenly_over_register_blocks(rows, tm, block):
    assert _even_block_rows(rows, tm) == block
    assert -(-rows // block) == -(-rows // tm)  # as few blocks as before, less padding


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_half_a_block_of_columns_runs_swapped_in_even_register_blocks(dtype):
    """x @ w with half a register block's columns runs swapped, its rows spread evenly over the
    register blocks (16 with AVX-512 and float32: two blocks of 8, not 12 + 4 of padding); every
    op of the zoo matches the reference. (By default its vector rows are faster: 3000 rows, one
    core, 575 against 874 us.)"""
    tm, tn = register_block(np.dtype(dtype).itemsize)
    m = tn // 2
    graph = matmul_zoo(600, m, dtype)
    module = emit_linalg(graph)
    with use_rates(NO_LOOPS):
        rewrite_matmuls(module)
        executable = CpuBackend().compile(graph)
    element = "f32" if dtype == "float32" else "f64"
    assert f"tensor<{-(-m // tm)}x600x{_even_block_rows(m, tm)}x{element}>" in str(module)
    _assert_matches_reference(graph, executable, BATCHES, dtype)


def _short_k_graph(k: int, width: int) -> Graph:
    """The products of a short static k: x @ w + b with ReLU, g @ w^T with the ReLU-grad mask,
    a bare g @ w^T, and an update c <- c - lr * p^T q in place (k the rows of p and q)."""
    x = make_node("input", [], name="x", shape=("N", k), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", k), dtype="float32")
    z = make_node("input", [], name="z", shape=("N", width), dtype="float32")
    p = make_node("input", [], name="p", shape=(k, width), dtype="float32")
    q = make_node("input", [], name="q", shape=(k, width + 3), dtype="float32")
    w = make_node("param", [], name="w", shape=(k, width), dtype="float32")
    v = make_node("param", [], name="v", shape=(width, k), dtype="float32")
    bias = make_node("param", [], name="bias", shape=(width,), dtype="float32")
    c = make_node("param", [], name="c", shape=(width, width + 3), dtype="float32")
    lr = make_node("param", [], name="lr", shape=(), dtype="float32")
    one = make_node("const", [], value=1.0, dtype="float32")
    outs = (make_node("linear", [x, w, bias], activation="relu"),
            make_node("matmul_relu_grad", [g, v, z], transpose_b=True),
            make_node("matmul", [g, v], transpose_b=True))
    update = make_node("gemm", [p, q, c, lr, one], transpose_a=True, subtract=True)
    return Graph((x, g, z, p, q), (w, v, bias, c, lr), outs, updates=(("c", update),), name="short_k")


@pytest.mark.parametrize("k", [3, 10, SHORT_K])
def test_products_with_a_short_k_are_one_pass_with_their_epilogue(k):
    """A product with a short static k is one element-wise generic (k unrolled) that its
    element-wise epilogue is merged into: no packing, no accumulator fill, no separate
    epilogue; the update writes its parameter in place. All match the reference."""
    graph = _short_k_graph(k, 1400)  # k * 1400 is enough work for the blocked path
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=False)
    text = str(module)
    assert "linalg.matmul" not in text and "mlirnn.packed" not in text and "linalg.fill" not in text
    generics = collect_ops(module, lambda op: op.name == "linalg.generic")
    assert len(generics) == 4 + 2  # the four products (epilogues merged) and the two copies of w^T and v^T rows
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 257), lr_slot=4, updated_slot=3)


@pytest.mark.parametrize("k", [10, SHORT_K])
def test_short_products_over_rows_a_multiple_of_1_kib_apart_match_the_reference(k):
    """A short product whose op(B) is too large for L1 runs in tasks of columns; rows of 1024
    floats (4 KiB apart) are first copied apart (``row_pitch``): a copy of the weight for x @ w + b,
    of the transposed copy of v for g @ v^T. All match the reference at awkward batches."""
    graph = _short_k_graph(k, 1024)
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 13, 33, 257, 4099), lr_slot=4,
                              updated_slot=3)


def test_sizes_cross_the_block_boundaries():
    tm, tn = register_block(4)
    _, _, kc = cache_blocks(4)
    assert 257 % tm and 7 % tm and 13 % tm and 33 % tn and 257 % tn and 7 < tn
    assert 257 > kc and 600 > 2 * kc and 600 % kc


def test_every_large_product_is_packed_and_small_ones_loop():
    blocked, looped = rewrite_matmuls(emit_linalg(matmul_zoo(257, 33, "float32")))
    assert looped == 1 and blocked >= 8  # only w^T @ x^T loops: it has the batch as its column count
    assert rewrite_matmuls(emit_linalg(matmul_zoo(32, 32, "float32")))[0] == 0  # the moons MLP's sizes


def test_the_serial_build_matches_the_threaded_one():
    graph = matmul_zoo(517, 515, "float32")
    inputs, params = arguments(graph, 100, np.random.default_rng(3))
    threaded = compile_kernel(graph)
    serial = compile_kernel(graph, threads=False)
    assert threaded.threaded and not serial.threaded
    for a, b in zip(CpuExecutable(graph, threaded).run(inputs, [p.copy() for p in params]),
                    CpuExecutable(graph, serial).run(inputs, [p.copy() for p in params])):
        np.testing.assert_array_equal(a, b)  # each block is summed in the same order either way


def _update_graph(k: int, m: int, also_read: bool, dtype: str = "float32", constant_lr: float | None = None,
                  batch: int | str = "N", transpose_a: bool = True) -> Graph:
    """W <- W - lr * x^T g (a blocked update product) in place; ``also_read``: another output
    reads W's old value after the update's product; ``constant_lr``: lr a constant, not a parameter;
    ``batch``: the size summed over; not ``transpose_a``: W - lr * x g with x stored (k, batch)."""
    x = make_node("input", [], name="x", shape=(batch, k) if transpose_a else (k, batch), dtype=dtype)
    g = make_node("input", [], name="g", shape=(batch, m), dtype=dtype)
    w = make_node("param", [], name="w", shape=(k, m), dtype=dtype)
    lr = (make_node("param", [], name="lr", shape=(), dtype=dtype) if constant_lr is None
          else make_node("const", [], value=constant_lr, dtype=dtype))
    one = make_node("const", [], value=1.0, dtype=dtype)
    update = make_node("gemm", [x, g, w, lr, one], transpose_a=transpose_a, subtract=True)
    outs = (make_node("matmul", [x, w]),) if also_read else ()
    params = (w,) if constant_lr is not None else (w, lr)
    return Graph((x, g), params, outs, updates=(("w", update),), name="update")


@pytest.mark.parametrize("k, m, also_read", [(257, 33, False), (13, 257, False), (33, 257, True), (65, 1024, False),
                                             (65, 1024, True)])  # 1024 columns: the epilogue on threads
def test_blocked_updates_write_the_parameter_in_place(k, m, also_read):
    graph = _update_graph(k, m, also_read)
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 257), lr_slot=1, updated_slot=0)


@pytest.mark.parametrize("k, m, dtype, into", [
    (65, 1024, "float32", True),  # 5 rows after the whole row panels
    (96, 1024, "float32", True),  # whole row panels only
    (100, 512, "float64", True),
    (25, 2048, "float32", True),  # two whole row panels and one row
    (96, 256, "float32", False),  # rows 1 KB apart: an accumulator and an update pass
])
def test_a_blocked_sgd_update_accumulates_into_the_parameter(k, m, dtype, into):
    """W <- W - lr * x^T g with whole column panels and W's rows over IN_PLACE_STRIDE_MAX bytes
    apart: the product's register blocks start from W itself, viewed as [k / tm, tm, m / tn, tn]
    (the last k % tm rows: one zero-started panel added to them after), with x scaled by -lr; no
    accumulator, no update pass over W. W is updated in place, as the reference, at awkward
    batches."""
    graph = _update_graph(k, m, False, dtype)
    module = emit_linalg(graph)
    rewrite_matmuls(module)
    w = list(module.body.operations[0].regions[0].blocks[0].arguments)[2]
    views = collect_ops(module, lambda op: op.name == "tensor.expand_shape" and len(op.results[0].type.shape) == 4)
    sources = [view.operands[0] for view in views]
    assert any(x == w or (x.owner.name == "tensor.extract_slice" and x.owner.operands[0] == w) for x in sources) == into
    updates = collect_ops(module, lambda op: op.name == "linalg.generic" and w in list(op.operands)
                          and ir.RankedTensorType(op.results[0].type).shape == [k, m])
    assert bool(updates) != into
    # the last rows' one row panel [1, tm, m / tn, tn] runs in tasks of column panels, not as one serial task
    tails = collect_ops(module, lambda op: op.name == "scf.forall"
                        and ir.RankedTensorType(op.results[0].type).shape[0] == 1)
    assert len(tails) == (into and k % register_block(np.dtype(dtype).itemsize)[0] != 0)
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 257), dtype, lr_slot=1, updated_slot=0)


@pytest.mark.parametrize("k, m, dtype", [(65, 1024, "float32"), (100, 512, "float64")])
def test_a_blocked_sgd_update_takes_deep_kc_slices(k, m, dtype):
    """W <- W - lr * x^T g accumulated into W runs in tasks of one row panel, which sweep one register
    block's rows of A: its kc slices are ``deep_kc``'s (one slice for a batch of 512, where the default
    was three of 192 on a 48 KiB L1d), so that W's register blocks are loaded and stored once per deeper
    slice; the report says so. W matches the reference at batches of one, two and three slices."""
    itemsize = np.dtype(dtype).itemsize
    tm, deep = register_block(itemsize)[0], deep_kc(register_block(itemsize)[0], itemsize)
    graph = _update_graph(k, m, False, dtype)
    module = emit_linalg(graph)
    (schedule,) = product_schedules(module)
    assert "accumulated into its parameter (the SGD update), in tasks of one row panel" in schedule.reason
    rewrite_matmuls(module, threads=True)
    slices = collect_ops(module, lambda o: o.name == "scf.for" and "mlirnn.kc_loop" in o.attributes)
    if deep > cache_blocks(itemsize)[2]:
        assert f"kc slices {deep} deep: tasks sweep {tm} rows of A" in schedule.reason
        assert slices and all(f"step %c{deep} " in str(o).splitlines()[0] for o in slices)
    else:  # (a host whose L2 holds no deeper slices)
        assert "kc slices" not in schedule.reason.split("SGD update")[1]
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 257, deep + 13, 2 * deep + 1), dtype,
                              lr_slot=1, updated_slot=0)


@pytest.mark.parametrize("k, m, constant_lr", [
    (65, 1024, None),  # x scaled as it is packed, its last 5 columns (a partial row panel) by a small copy
    (1031, 528, None),  # more rows than columns: g scaled as it is packed (rows 2112 bytes apart)
    (96, 1024, 0.05),  # a constant factor (-1: x is multiplied by lr before the product)
])
def test_a_blocked_sgd_update_scales_its_operand_as_it_packs_it(k, m, constant_lr):
    """W - lr * x^T g accumulated into W: the factor -lr multiplies x (or g, the operand with fewer
    columns) inside its packing copies; no scaled copy of the whole operand is made first (a pass over
    a batch-sized matrix). W matches the reference at awkward batches."""
    graph = _update_graph(k, m, False, constant_lr=constant_lr)
    with use_rates(NO_LOOPS):
        module = emit_linalg(graph)
        rewrite_matmuls(module)
        executable = CpuBackend().compile(graph)
    x, g, w = list(module.body.operations[0].regions[0].blocks[0].arguments)[:3]
    update_passes = collect_ops(module, lambda op: op.name == "linalg.generic" and w in list(op.operands)
                                and ir.RankedTensorType(op.results[0].type).shape == [k, m])
    assert not update_passes  # the product accumulates into W
    copies = collect_ops(module, lambda op: op.name == "linalg.generic" and {x, g} & set(op.operands))
    assert len(copies) == (constant_lr is not None)  # (a constant lr: lr * x is emitted; the pack negates)
    _assert_matches_reference(graph, executable, (1, 7, 257, 1000), lr_slot=None if constant_lr else 1,
                              updated_slot=0)


def test_an_sgd_update_scales_an_operand_packed_by_transposed_tiles():
    """W - lr * A @ G with A (m, k) not transposed, both static (a parameter's gradient that is no
    weight gradient over a batch, as a low-rank factor's): A's 37 rows (prime: no block of rows
    divides them, so A is packed, not read in place) go into row panels by transposed vector
    tiles, the factor -lr multiplying the transposed tiles; only the 7 rows of the partial last
    panel get a scaled copy, not the whole of A. W matches the reference."""
    m, k = 37, 40
    graph = _update_graph(m, 1024, False, batch=k, transpose_a=False)
    with use_rates(NO_LOOPS):
        module = emit_linalg(graph)
        rewrite_matmuls(module)  # (the schedule vectorizes the packs)
        executable = CpuBackend().compile(graph)
    lr_arg = list(module.body.operations[0].regions[0].blocks[0].arguments)[3]

    def made_by(value: ir.Value, name: str) -> ir.Operation | None:
        """The op named ``name`` that ``value`` comes from, through shape casts."""
        while not isinstance(value.owner, ir.Block) and value.owner.name == "vector.shape_cast":
            value = value.owner.operands[0]
        return None if isinstance(value.owner, ir.Block) or value.owner.name != name else value.owner

    def scales_a_transposed_tile(op: ir.Operation) -> bool:
        if op.name != "arith.mulf" or made_by(op.operands[0], "vector.shuffle") is None:
            return False
        lr_vector = made_by(op.operands[1], "vector.broadcast")
        lr_read = None if lr_vector is None else made_by(lr_vector.operands[0], "tensor.extract")
        return lr_read is not None and lr_arg in list(lr_read.operands)

    assert collect_ops(module, scales_a_transposed_tile)
    copies = collect_ops(module, lambda op: op.name == "linalg.generic"
                         and ir.RankedTensorType(op.results[0].type).shape == [m, k])
    assert not copies  # no scaled copy of A
    _assert_matches_reference(graph, executable, (1,), lr_slot=1, updated_slot=0)


def test_a_blocked_update_copies_no_parameter():
    """The epilogue reads and writes W through its init: after bufferization no memref.copy
    of W is left (it was W into a temporary and back, serial passes over the whole parameter)."""
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("convert-linalg-to-loops"))
    until_loops = Pipeline("until-loops", shipped.passes[:cut])  # copies are still memref.copy here
    module, _, _ = lower(_update_graph(65, 1024, False), until_loops, threads=True)  # epilogue on threads
    assert "omp.parallel" in str(module)  # the threaded build
    copies = [line for line in str(module).splitlines() if "memref.copy" in line]
    assert not [line for line in copies if "65x1024xf32" in line]  # W's shape (the last panel's copy is small)


def test_packing_pads_only_the_last_partial_panel():
    """x @ w with a batch of rows that is no multiple of the register block: whole panels are
    packed straight from x, only the last panel's rows are zero-padded (a static tile of rows,
    not a fill and copy of the whole of x)."""
    x = make_node("input", [], name="x", shape=("N", 1024), dtype="float32")
    w = make_node("param", [], name="w", shape=(1024, 64), dtype="float32")
    graph = Graph((x,), (w,), (make_node("matmul", [x, w]),), name="rows")
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("convert-linalg-to-loops"))
    with use_rates(NO_LOOPS):  # by default vector rows (k in steps)
        module, _, _ = lower(graph, Pipeline("until-loops", shipped.passes[:cut]), threads=True)
    fills = [line for line in str(module).splitlines() if "linalg.fill" in line and "mlirnn.acc_init" not in line]
    tm, _ = register_block(4)
    assert fills and all(f"memref<{tm}x1024xf32>" in line for line in fills), fills


@pytest.mark.parametrize("row_panels, col_panels, tasks", [
    (6, 9, (5, 3)),  # one default task: 2 x 2 tasks of 5 or 4 column panels and 3 row panels
    (11, 18, (9, 6)),  # default 16 + 2 column panels: 9 + 9, and 6 + 5 row panels
    (2, 1, (1, 1)),  # as many tasks as there are panels
    (66, 32, None),  # ten default tasks: kept
])
def test_few_or_uneven_tasks_are_balanced(row_panels, col_panels, tasks):
    assert balanced_tasks(row_panels, col_panels, 16, 16) == tasks


@pytest.mark.parametrize("row_panels, col_panels, threads, tasks", [
    (66, 8, 1, (8, 14)),  # one thread: 5 tasks of at most 14 row panels
    (66, 8, 2, (8, 11)),  # two: 6 of 11 (5 of 14 left one thread 38 of the 66 panels)
    (66, 8, 3, (8, 11)),  # three: 6 of 11 as well
    (22, 2, 2, (1, 6)),  # 4 tasks of 12, 12, 12 and 8 panels: 8 of 6, 6, 6, 4 panels (22 each)
    (6, 9, 2, (5, 3)),  # already even: kept
])
def test_balanced_tasks_share_the_panels_evenly_over_the_threads(row_panels, col_panels, threads, tasks):
    assert balanced_tasks(row_panels, col_panels, 16, 16, threads) == tasks


@pytest.mark.parametrize("batch_rows, by_columns", [(256, True), (512, False), (2048, False)])
def test_a_product_over_a_batch_shorter_than_its_columns_runs_in_column_tasks(batch_rows, by_columns):
    """x @ W with W 512 x 512 (16 column panels with AVX-512, one default task's) over a batch
    traced at 256 rows: tasks of 4 column panels over the whole batch, each thread reading its
    columns of W; at 512 rows or more, tasks of row panels. Both match the reference at awkward
    batches."""
    if vector_bytes() != 64:
        pytest.skip("the panel counts are those of 64-byte vectors")
    x = make_node("input", [], name="x", shape=("N", 512), dtype="float32")
    w = make_node("param", [], name="w", shape=(512, 512), dtype="float32")
    graph = Graph((x,), (w,), (make_node("matmul", [x, w]),), name="columns").with_batch_rows(batch_rows)
    module = emit_linalg(graph)
    with module.context:
        (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
        plan = product_plan(op, threads=True, batch_rows=batch_rows)
    assert plan.kind == "blocked" and plan.threads and plan.column_tasks == by_columns, plan.reason
    rewrite_matmuls(module, threads=True, batch_rows=batch_rows)
    column_foralls = re.findall(r"scf.forall \(%\w+\) in \(4\) shared_outs\(%\w+ = %\w+\) -> \(tensor<\?x12x16x32xf32>",
                                str(module))  # 16 column panels in 4 tasks, each over every row panel
    assert len(column_foralls) == by_columns
    _assert_matches_reference(graph, CpuBackend().compile(graph), (*BATCHES, 4099))


@pytest.mark.parametrize("n, by_columns", [(256, True), (400, False), (384, False)])
def test_column_tasks_share_the_columns_evenly(n, by_columns):
    """8 column panels make two tasks of 4, one a thread; 13 (400 columns) would be 4, 4, 4 and 1,
    12 (384) three tasks: those stay in tasks of row panels."""
    if vector_bytes() != 64:
        pytest.skip("the panel counts are those of 64-byte vectors")
    x = make_node("input", [], name="x", shape=("N", 300), dtype="float32")
    w = make_node("param", [], name="w", shape=(300, n), dtype="float32")
    module = emit_linalg(Graph((x,), (w,), (make_node("matmul", [x, w]),), name="columns"))
    with module.context:
        (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
        plan = product_plan(op, threads=True, rates=DEFAULT, batch_rows=128)
    assert plan.threads and plan.column_tasks == by_columns, plan.reason


def test_a_weight_gradient_of_784_x_256_runs_in_tasks_that_share_evenly():
    """x^T @ g with 784 x 256 outputs (66 x 8 panels with AVX-512) over a dynamic batch: tasks of
    rows that share the panels evenly on the table's threads; it matches the reference at awkward
    batches."""
    x = make_node("input", [], name="x", shape=("N", 784), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", 256), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    tm, tn = register_block(4)
    mc, nc, _ = cache_blocks(4)
    row_panels, col_panels = math.ceil(784 / tm), math.ceil(256 / tn)
    tasks = balanced_tasks(row_panels, col_panels, mc // tm, nc // tn, active().threads)
    module = emit_linalg(graph)
    with module.context:
        (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
        assert product_plan(op, threads=True).tasks == tasks
    executable = CpuBackend().compile(graph)
    _assert_matches_reference(graph, executable, BATCHES)
    rng = np.random.default_rng(0)  # 4099 rows: against float64 sums (float32 ones differ by their order)
    xs, gs = rng.standard_normal((4099, 784)).astype(np.float32), rng.standard_normal((4099, 256)).astype(np.float32)
    (got,) = executable.run([xs, gs], [])
    np.testing.assert_allclose(got, xs.T.astype(np.float64) @ gs, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_products_whose_tasks_sweep_few_rows_take_deep_kc_slices_and_match_the_reference(dtype):
    """x @ w (1100 x 600) over the batch: its tasks sweep mc rows of A, so its kc slices are as deep as
    ``deep_kc`` says (1024 + 76 on a 512 KiB L2, not five slices of 256), and the plan says so; a weight
    gradient summed in ranges of the batch keeps the default; both match the reference."""
    x = make_node("input", [], name="x", shape=("N", 1100), dtype=dtype)
    h = make_node("input", [], name="h", shape=("N", 256), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", 256), dtype=dtype)
    w = make_node("param", [], name="w", shape=(1100, 600), dtype=dtype)
    graph = Graph((x, h, g), (w,), (make_node("matmul", [x, w]), make_node("matmul", [h, g], transpose_a=True)),
                  name="deep")
    assert 256 * 256 <= K_RANGES_OUTPUT_MAX
    itemsize = np.dtype(dtype).itemsize
    tm, _ = register_block(itemsize)
    mc, _, kc = cache_blocks(itemsize)
    deep = deep_kc(mc // tm * tm, itemsize)
    module = emit_linalg(graph)
    with module.context:
        forward, gradient = (product_plan(op, threads=True)
                             for op in collect_ops(module, lambda o: o.name == "linalg.matmul"))
    assert gradient.k_ranges is not None and gradient.kc is None
    if deep > kc:
        assert forward.kc == deep and f"kc slices {deep} deep: tasks sweep {mc // tm * tm} rows" in forward.reason
    else:  # (a host whose L2 holds no deeper slices)
        assert forward.kc is None
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES, dtype)


def test_a_weight_gradient_of_few_panels_runs_in_balanced_tasks():
    """x^T @ g with 144 x 544 outputs (12 x 17 register-block panels, k the batch: too many for
    partial sums over ranges of the batch) was two tasks: now four; it matches the reference at
    awkward batches."""
    x = make_node("input", [], name="x", shape=("N", 144), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", 544), dtype="float32")
    assert 144 * 544 > K_RANGES_OUTPUT_MAX
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    tm, tn = register_block(4)
    mc, nc, _ = cache_blocks(4)
    row_panels, col_panels = math.ceil(144 / tm), math.ceil(544 / tn)
    tasks = balanced_tasks(row_panels, col_panels, mc // tm, nc // tn, active().threads)
    assert tasks is not None
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=True)
    foralls = re.findall(r"scf.forall \(%\w+, %\w+\) in \((\d+), (\d+)\)", str(module))
    assert (str(math.ceil(col_panels / tasks[0])), str(math.ceil(row_panels / tasks[1]))) in foralls
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 257))


def test_batch_rows_are_packed_in_whole_groups_and_only_the_rest_is_masked():
    """x^T @ g (a weight gradient, the batch as k): both operands' rows are the batch. Copies
    in static groups of PACK_ROWS_STEP rows need no masks; only the last few rows of each
    operand are copied with a masked read and write (masked copies of every row cost up to
    45% of such a product's time)."""
    x = make_node("input", [], name="x", shape=("N", 600), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", 512), dtype="float32")
    module = emit_linalg(Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights"))
    rewrite_matmuls(module, threads=True)
    transfers = [line for line in str(module).splitlines() if "vector.transfer_" in line]
    tm, tn = register_block(4)
    for lanes in (tm, tn):
        assert any(f"vector<1x{PACK_ROWS_STEP}x1x{lanes}xf32>" in line for line in transfers)  # group reads
        assert any(f"vector<1x1x{PACK_ROWS_STEP}x{lanes}xf32>" in line for line in transfers)  # group writes
    # operands after the indices: a read's padding and mask, a write's mask
    masked = [line for line in transfers
              if line.split("]")[1].split("{")[0].count("%") == (2 if "transfer_read" in line else 1)]
    assert len(masked) == 4, masked  # each operand's rest: one read, one write


def test_packings_into_few_panels_spread_over_the_batch():
    """x^T @ g with 15 x 120 outputs (AVX-512; 3.75 column panels) and k the batch (a
    convolution's weight gradient): g's rows go into 4 column panels, so a task of 4 panels held
    the whole packing on one core; it is now split into tasks of PACK_TASK_ROWS rows on threads,
    and matches the reference with a partial last task. (15 rows split into no whole register
    blocks: x^T is packed too.)"""
    tn = register_block(4)[1]
    x = make_node("input", [], name="x", shape=(3000, 15), dtype="float32")
    g = make_node("input", [], name="g", shape=(3000, 3 * tn + 3 * tn // 4), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=True)
    text = str(module)
    packings = re.findall(r"scf.forall \(%\w+\) in \((%?\w+)\)", text)  # one per operand
    assert packings == [str(math.ceil(3000 / PACK_TASK_ROWS))] * 2 and f"(d0 * {PACK_TASK_ROWS})" in text
    _assert_matches_reference(graph, CpuBackend().compile(graph), (3000,))


@pytest.mark.parametrize("rows", [3000, 513])
def test_the_last_column_panel_is_written_in_place(rows):
    """x^T @ g with 150 columns of g (LeNet's convolution weight gradient, k the pixels): the
    22 columns after the whole panels are copied straight into the last panel (on threads
    when there are many rows) and only its last columns are zeroed: no zero-filled padded
    copy of the columns, packed again into the panel. It matches the reference."""
    x = make_node("input", [], name="x", shape=(rows, 16), dtype="float32")
    g = make_node("input", [], name="g", shape=(rows, 150), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("convert-linalg-to-loops"))
    module, _, _ = lower(graph, Pipeline("until-loops", shipped.passes[:cut]), threads=True)
    lines = str(module).splitlines()
    _, tn = register_block(4)
    panel = f"x{tn}xf32"
    assert not [line for line in lines if ("linalg.fill" in line or "memref.copy" in line) and panel in line]
    copies = [line for line in lines if "linalg.copy" in line and f"x{150 % tn}xf32" in line]
    assert len(copies) == 1 and ("mlirnn.parallel_map" in copies[0]) == (rows == 3000)
    _assert_matches_reference(graph, CpuBackend().compile(graph), (rows,))


@pytest.mark.parametrize("k", [150, 120, 105])
def test_transposing_packs_copy_whole_vector_tiles_and_only_the_last_columns_plainly(k):
    """A k that is not a multiple of TRANSPOSE_TILE (LeNet's 150 im2col columns, its 120-wide
    layer; and the 40 columns of the output): the packings that transpose copy the first columns
    as vector tiles; only the last few (k or 40 % TRANSPOSE_TILE) stay an element-wise copy
    (packed whole, all k columns were one)."""
    graph = matmul_zoo(k, 40, "float32")
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=False)
    plain = collect_ops(module, lambda op: op.name == "linalg.generic" and PACK in op.attributes)
    widths = {ir.RankedTensorType(op.results[0].type).shape[1] for op in plain}
    assert k % TRANSPOSE_TILE in widths and all(w < TRANSPOSE_TILE for w in widths)
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 13, 33))


def test_products_of_one_column_task_split_their_rows_into_finer_tasks():
    """x @ w over the batch with 512 columns (one task's): tasks of a quarter of the default row
    panels, so that a partial last task leaves the other core little to wait for (at batch 256
    the default split 22 panels 16 + 6); a wider product keeps the default; both match the
    reference at awkward batches."""
    tm, tn = register_block(4)
    mc, nc, _ = cache_blocks(4)
    default = mc // tm
    assert max(1, default // FINE_TASK_SHARE) < default
    for n, finer in ((nc, True), (2 * nc, False)):
        graph = _product_graph(128, n, "float32")
        module = emit_linalg(graph)
        rewrite_matmuls(module, threads=True)
        assert (f"s0 ceildiv {default})" not in str(module)) == finer  # the tasks over the batch's row panels
        _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 13, 257))


def _block_of(rows: int, tm: int) -> int | None:
    """The rows per register block of an operand read in place (a divisor over tm / 2), or None."""
    return next((r for r in range(tm, tm // 2, -1) if rows % r == 0), None)


@pytest.mark.parametrize("rows, k, m, dtype", [
    (33, 257, 40, "float32"),  # blocks of 11 rows; k over a kc slice; a zero-padded column panel
    (2048, 64, 96, "float32"),  # GPT's static batch: blocks of 8 rows; x^T as blocks of 8; g, w in place
    (13, 600, 33, "float32"),  # 13 rows: no whole blocks of 7 to 12, so x is packed
    (20, 130, 24, "float64"),  # blocks of 10 rows
    (64, 48, 64, "float64"),  # blocks of 8 rows; x^T in blocks of 12; w and g in place
])
def test_static_operands_are_read_in_place_in_whole_register_blocks(rows, k, m, dtype):
    """Over a static row count with a divisor between half a register block and a whole one,
    the products read A = x or g in place as [m / tm, tm, k] blocks of rows (no packing); a
    transposed A stored (k, m) as [k, m / tm, tm] and B (k, n) as [k, n / tn, tn] when their
    sizes split the same way and their rows are at most IN_PLACE_STRIDE_MAX bytes apart; the
    others are packed. Every op of the zoo matches the reference, on threads and on one."""
    graph = matmul_zoo(k, m, dtype, rows=rows)
    module = emit_linalg(graph)
    rewrite_matmuls(module)
    itemsize = np.dtype(dtype).itemsize
    tm, tn = register_block(itemsize)
    element = "f32" if dtype == "float32" else "f64"
    block, even = _block_of(rows, tm), _even_block_rows(rows, tm)
    text = str(module)
    # x @ w: x read as blocks of its rows, or packed as row panels [mb, k, tm]
    assert (f"tensor<{rows // (block or 1)}x{block}x{k}x{element}>" in text) == (block is not None)
    assert (f"tensor<{-(-rows // even)}x{k}x{even}x{element}>" in text) == (block is None)
    # x^T @ g: x (rows, k) as [rows, k / tm, tm]; g and w (k, m) as column panels in place
    x_block = _block_of(k, tm) if k * itemsize <= IN_PLACE_STRIDE_MAX else None
    assert (f"tensor<{rows}x{k // (x_block or 1)}x{x_block}x{element}>" in text) == (x_block is not None)
    if m % tn == 0 and m * itemsize <= IN_PLACE_STRIDE_MAX and m * itemsize % ALIASED_PITCH:
        assert f"tensor<{k}x{m // tn}x{tn}x{element}>" in text and f"tensor<{rows}x{m // tn}x{tn}x{element}>" in text
    for threads in (True, False):
        _assert_matches_reference(graph, CpuExecutable(graph, compile_kernel(graph, threads=threads)), (rows,), dtype)


@pytest.mark.parametrize("k, m, dtype", [
    (100, 100, "float32"),  # a 100-wide hidden layer
    (40, 257, "float32"),  # many column panels, k under a vector tile
    (130, 50, "float64"),
])
def test_an_element_wise_producer_writes_a_products_rows_into_whole_row_panels(k, m, dtype):
    """relu(x) @ w over the dynamic batch, as a hidden layer's input: the relu writes into the
    first rows of a buffer of whole row panels (its last rows zeroed), which the product reads in
    place as [ceil(N / tm), tm, k], not packed; the relu's other readers (the output itself,
    relu(x)^T g as a weight gradient) read the same rows. x itself (an input) is still packed.
    Everything matches the reference at awkward batches, on threads and on one."""
    x = make_node("input", [], name="x", shape=("N", k), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", m), dtype=dtype)
    w = make_node("param", [], name="w", shape=(k, m), dtype=dtype)
    h = make_node("relu", [x])
    outs = (make_node("matmul", [h, w]), h, make_node("matmul", [h, g], transpose_a=True), make_node("matmul", [x, w]))
    graph = Graph((x, g), (w,), outs, name="hidden")
    module = emit_linalg(graph)
    rewrite_matmuls(module)
    tm = register_block(np.dtype(dtype).itemsize)[0]
    element = "f32" if dtype == "float32" else "f64"
    padded = collect_ops(module, lambda op: op.name == "bufferization.alloc_tensor" and PADDED_ROWS in op.attributes)
    assert len(padded) == 1 and f"tensor<?x{tm}x{k}x{element}>" in str(module)
    for threads in (True, False):
        executable = CpuExecutable(graph, compile_kernel(graph, threads=threads))
        _assert_matches_reference(graph, executable, BATCHES + (4099,), dtype)


@pytest.mark.parametrize("m, n, in_place", [
    (100, 100, True),  # blocks of 10 rows, few columns: packing x would cost more
    (100, 2 * IN_PLACE_SHORT_COLUMNS_MAX, False),  # blocks of 10 rows, many columns: packed into whole blocks
    (96, 2 * IN_PLACE_SHORT_COLUMNS_MAX, True),  # whole register blocks: in place at any n
])
def test_a_weight_gradients_x_is_read_in_place_over_a_dynamic_batch(m, n, in_place):
    """x^T @ g over the dynamic batch (a weight gradient): x (N, m) is read in place as
    [N, m / rows, rows] when m splits into whole blocks of rows; blocks shorter than a register
    block's only when the product has at most IN_PLACE_SHORT_COLUMNS_MAX columns. Matches the
    reference at awkward batches."""
    x = make_node("input", [], name="x", shape=("N", m), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", n), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    module = emit_linalg(graph)
    rewrite_matmuls(module)
    rows = _block_of(m, register_block(4)[0])
    assert (f"tensor<?x{m // rows}x{rows}xf32>" in str(module)) == in_place
    _assert_matches_reference(graph, CpuBackend().compile(graph), (1, 7, 13, 257))


def test_balanced_tasks_count_the_register_blocks_of_an_operand_read_in_place():
    """x^T @ g over a static batch with 256 x 64 outputs: x is read in place in register blocks
    that divide its 256 rows (8 with AVX-512, not 22 panels of 12), and its balanced tasks are
    counted in those blocks (four tasks of 8 row panels, not 6 tasks for 32 panels counted as 22)."""
    x = make_node("input", [], name="x", shape=(2048, 256), dtype="float32")
    g = make_node("input", [], name="g", shape=(2048, 64), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    tm, tn = register_block(4)
    mc, nc, _ = cache_blocks(4)
    rows = _block_of(256, tm)
    row_panels, col_panels = 256 // rows, 64 // tn
    tasks = balanced_tasks(row_panels, col_panels, mc // rows, nc // tn, active().threads)
    assert tasks is not None and rows != tm
    module = emit_linalg(graph)
    rewrite_matmuls(module, threads=True)
    foralls = re.findall(r"scf.forall \([%\w, ]+\) in \(([\d, ]+)\)", str(module))  # (a unit dim folds away)
    assert [math.prod(int(d) for d in f.split(",")) for f in foralls] == [
        math.ceil(col_panels / tasks[0]) * math.ceil(row_panels / tasks[1])]
    _assert_matches_reference(graph, CpuBackend().compile(graph), (2048,))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("extra, narrow", [(1, True), (4, True), ("half", True), ("half+1", False), (0, False)])
def test_a_short_last_column_panel_runs_in_blocks_one_register_wide(dtype, extra, narrow):
    """A product whose n leaves at most one vector register in its last two-register panel (a
    100-wide layer: 3 x 32 + 4 floats with AVX-512) runs in register blocks one register wide,
    its B packed into panels of that width, when that saves enough padding; a last panel fuller
    than that, or none, keeps the two-register blocks. Every op of the zoo matches the reference
    at awkward batches."""
    itemsize = np.dtype(dtype).itemsize
    tn = register_block(itemsize)[1]
    lanes = tn // 2
    n = 3 * tn + {"half": lanes, "half+1": lanes + 1}.get(extra, extra)
    width = lanes if narrow else tn
    assert block_columns(n, itemsize) == width
    assert block_columns(tn // 2 + 1, itemsize) == tn  # one panel or less: as before (swapped or one panel)
    assert block_columns(31 * tn + lanes // 2, itemsize) == tn  # saves under NARROW_SAVING_MIN of the columns
    graph = _product_graph(130, n, dtype)
    module = emit_linalg(graph)
    op = collect_ops(module, lambda o: o.name == "linalg.matmul")[0]
    plan = product_plan(op, threads=True)
    assert plan.kind == "blocked" and plan.columns == width, plan
    rewrite_matmuls(module)
    element = "f32" if dtype == "float32" else "f64"
    panels = -(-n // width)  # B's column panels, packed or (whole panels) read in place
    text = str(module)
    assert f"tensor<{panels}x130x{width}x{element}>" in text or f"tensor<130x{panels}x{width}x{element}>" in text
    zoo = matmul_zoo(130, n, dtype)
    _assert_matches_reference(zoo, CpuBackend().compile(zoo), BATCHES, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocks_of_too_few_rows_stay_two_registers_wide(dtype, monkeypatch):
    """With AVX2's register blocks (6 rows: six FMA chains, one register wide) a short last
    column panel keeps the two-register blocks, which ran the 100-wide layers' step 15% faster;
    the product matches the reference at awkward batches."""
    monkeypatch.setenv(PLANNED_TARGET_ENV, "32,32,512")
    replan()
    itemsize = np.dtype(dtype).itemsize
    tm, tn = register_block(itemsize)
    assert tm < NARROW_ROWS_MIN
    n = 3 * tn + 1  # one column in the last panel: one register wide would save most padding
    assert block_columns(n, itemsize) == tn
    module = emit_linalg(_product_graph(130, n, dtype))  # (the op lives as long as its module)
    op = collect_ops(module, lambda o: o.name == "linalg.matmul")[0]
    plan = product_plan(op, threads=True)
    assert plan.kind == "blocked" and plan.columns == tn, plan
    zoo = matmul_zoo(130, n, dtype)
    _assert_matches_reference(zoo, CpuBackend().compile(zoo), BATCHES, dtype)


def test_a_ten_column_weight_gradient_splits_its_lanes_in_each_chunk(monkeypatch):
    """With AVX2 (8 lanes) the weight gradient of a 1000-10 layer (x^T g summed over the batch,
    chunks of its 1000 x 10 accumulator as tasks) splits its 10 columns into 8 + 2 inside each
    chunk: split first, each part was a pass of its own over x (40 MB at batch 10000; the step
    19.3 -> 15.7 ms on a Zen 3 host). One product, one chunk loop; it matches the reference at
    awkward batches, 4099 rows included."""
    monkeypatch.setenv(PLANNED_TARGET_ENV, "32,32,512")
    replan()
    x = make_node("input", [], name="x", shape=("N", 1000), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", 10), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    module = emit_linalg(graph)
    found, tagged = cpu_matmul._schedule_tags, []
    monkeypatch.setattr(cpu_matmul, "_schedule_tags", lambda module: tagged.append(found(module)) or tagged[-1])
    with use_rates(NO_BLOCKS):
        assert rewrite_matmuls(module)[0] == 0
    assert tagged[0].chunk_splits == {(2, 8)} and not tagged[0].splits
    assert [tag for tag, _ in tagged[0].chunks] == [cpu_matmul.SMALL_CHUNK_TASKS]
    assert len(re.findall(r"scf.forall \(", str(module))) == 1  # both parts in the one loop over chunks
    widths = {int(w) for w in re.findall(r"vector.fma .*: vector<(\d+)xf32>", str(module))}
    assert widths == {8, 2}, widths
    with use_rates(NO_BLOCKS):
        executable = CpuBackend().compile(graph)
    _assert_matches_reference(graph, executable, BATCHES + (4099,))


@pytest.mark.parametrize("width, thread_count", [(64, None), (100, None), (64, 2), (100, 3)])
def test_a_batchs_row_groups_are_packed_in_a_block_a_thread(width, thread_count, monkeypatch):
    """x^T @ g over a dynamic batch (a 64- or 100-wide layer's weight gradient): the rows the
    batch's groups copy into g's few panels are spread over the groups, so that each thread packs
    rows it wrote itself; a task of panels held the whole packing on one core (on two cores that
    share no L3, 2.5 of a 16-64x7-1 step's 9 ms). Given the computing threads, one block of groups
    a thread, as the passes before split the batch (tasks of PACK_TASK_ROWS rows left a batch of
    256 one task); else tasks of PACK_TASK_ROWS rows. It matches the reference with no whole group,
    one group, fewer groups than threads, a partial last block and a partial last task."""
    x = make_node("input", [], name="x", shape=("N", width), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", width), dtype="float32")
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    module = emit_linalg(graph)
    with use_rates(NO_LOOPS):  # 64 wide: vector sums over the batch by default
        rewrite_matmuls(module, threads=True, thread_count=thread_count)
    groups = PACK_TASK_ROWS // PACK_ROWS_STEP
    blocks = re.findall(r"scf.forall \(%\w+\) in \((\d+)\)", str(module))
    if thread_count is None:
        assert f"(d0 * {groups})" in str(module)  # a task's first group
    else:
        assert f"(d0 * {groups})" not in str(module) and str(thread_count) in blocks
    rows = (1, PACK_ROWS_STEP - 1, PACK_ROWS_STEP, 2 * PACK_ROWS_STEP + 1, PACK_TASK_ROWS + 3,
            3 * PACK_TASK_ROWS + PACK_ROWS_STEP + 5)
    monkeypatch.setenv(NUM_THREADS_ENV, str(thread_count or 2))  # the backend's count: one block a thread
    with use_rates(NO_LOOPS):
        executable = CpuBackend().compile(graph)
    _assert_matches_reference(graph, executable, rows)


@pytest.mark.parametrize("m, n, dtype", [(200, 50, "float32"), (96, 64, "float32"), (100, 100, "float64"),
                                         (65, 70, "float32"), (256, 256, "float32")])
def test_a_small_weight_gradient_sums_ranges_of_the_batch_in_tasks(m, n, dtype):
    """x^T @ g over the dynamic batch with a small output (packed or read in place): one task loop
    of one product whose tasks are chosen at run time: from a batch of k_ranges[1] rows, equal
    ranges of the batch (up to k_ranges[2]), each into a partial sum of its own, added at the end;
    below, the tiles of the output that the tagged product's tasks take. Matches the reference on
    both sides of the switch, with one range, some and the most (TASKS_MAX, fewer for a large
    output: K_RANGES_PARTIALS_BYTES)."""
    x = make_node("input", [], name="x", shape=("N", m), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", n), dtype=dtype)
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    module = emit_linalg(graph)
    (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
    with use_rates(NO_LOOPS):  # 96 x 64 sums over the batch as vector code by default
        plan = product_plan(op, threads=True)
    if plan.kind != "blocked":
        pytest.skip(f"{m} x {n} is not blocked here: {plan.reason}")
    assert plan.k_ranges is not None
    rows, batch_min, ranges = plan.k_ranges
    assert rows >= TASKS_MAX and batch_min >= 2 * rows and 2 <= ranges <= TASKS_MAX
    assert ranges == TASKS_MAX or (ranges + 1) * m * n * (4 if dtype == "float32" else 8) > K_RANGES_PARTIALS_BYTES
    with use_rates(NO_LOOPS):
        rewrite_matmuls(module, threads=True)
        executable = CpuBackend().compile(graph)
    text = str(module)
    assert re.search(r"scf.forall \(%\w+\) in \(%\w+\)", text)  # a dynamic number of tasks
    assert re.search(rf"tensor<{ranges}x\d+x\d+x\d+x\d+x{'f32' if dtype == 'float32' else 'f64'}>", text)
    batches = (1, 7, 13, 33, 257, batch_min - 1, batch_min, batch_min + 3 * rows + 5, ranges * rows + batch_min + 3,
               4099)
    _assert_matches_reference(graph, executable, batches, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_weight_gradient_summed_in_ranges_with_x_in_place_takes_shallow_slices(dtype, monkeypatch):
    """x^T g over the batch with x read in place (100 columns: blocks of 5 rows) and summed in
    ranges of the batch: each task sweeps all of x's columns, so its kc slices are as deep as
    ``in_place_kc`` of x's rows (their cache lines and a panel's slice fit L1), not the default; the
    product matches the reference at awkward batches and on both sides of the ranges' switch."""
    monkeypatch.setenv(PLANNED_TARGET_ENV, "32,32,512")
    replan()
    itemsize = np.dtype(dtype).itemsize
    x = make_node("input", [], name="x", shape=("N", 100), dtype=dtype)
    g = make_node("input", [], name="g", shape=("N", 100), dtype=dtype)
    graph = Graph((x, g), (), (make_node("matmul", [x, g], transpose_a=True),), name="weights")
    module = emit_linalg(graph)
    (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
    plan = product_plan(op, threads=True)
    assert plan.kind == "blocked" and plan.k_ranges is not None, plan
    assert plan.kc == in_place_kc(100 * itemsize, itemsize) < cache_blocks(itemsize)[2], plan
    rewrite_matmuls(module, threads=True)
    slices = collect_ops(module, lambda o: o.name == "scf.for" and "mlirnn.kc_loop" in o.attributes)
    assert slices and all(f"step %c{plan.kc} " in str(o).splitlines()[0] for o in slices)
    batch_min = plan.k_ranges[1]
    _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES + (batch_min - 1, batch_min + 7, 4099),
                              dtype)


@pytest.mark.parametrize("k, n, dtype", [(96, 1024, "float32"), (40, 4096, "float32"), (33, 544, "float64"),
                                         (64, 256, "float32"), (40, 512, "float32"), (33, 128, "float64")])
def test_few_batch_rows_read_a_wide_or_aliased_b_in_place(k, n, dtype):
    """x @ w over a batch estimated at STRIDED_COLUMNS_ROWS_MAX rows or fewer (``Graph.batch_rows``),
    w's rows over IN_PLACE_STRIDE_MAX bytes apart or a multiple of ALIASED_PITCH (1 or 2 KiB: a
    kc-deep slice of a column panel on a few L1 sets): w is read in place (packing it is a copy
    of w per call, which few rows do not pay back), in kc slices STRIDED_COLUMNS_KC deep (never
    ``deep_kc``'s: the slice's rows fall on few cache sets); estimated at more rows, or not at all,
    packed as column panels [n / tn, k, tn]. Matches the reference at every batch either way."""
    itemsize = np.dtype(dtype).itemsize
    tn = register_block(itemsize)[1]
    assert (n * itemsize > IN_PLACE_STRIDE_MAX or n * itemsize % ALIASED_PITCH == 0) and n % tn == 0
    element = "f32" if dtype == "float32" else "f64"
    packed = f"tensor<{n // tn}x{k}x{tn}x{element}>"
    for rows, strided in ((STRIDED_COLUMNS_ROWS_MAX, True), (1, True), (2 * STRIDED_COLUMNS_ROWS_MAX, False),
                          (None, False)):
        graph = _product_graph(k, n, dtype).with_batch_rows(rows)
        module = emit_linalg(graph)
        (op,) = collect_ops(module, lambda o: o.name == "linalg.matmul")
        with module.context:
            plan = product_plan(op, threads=True, batch_rows=graph.batch_rows)
        assert plan.kind == "blocked" and plan.strided_columns == strided, plan
        assert ("B read in place" in plan.reason) == strided
        if strided:
            assert plan.kc == (STRIDED_COLUMNS_KC if STRIDED_COLUMNS_KC < cache_blocks(itemsize)[2] else None), plan
        rewrite_matmuls(module, threads=True, batch_rows=graph.batch_rows)
        text = str(module)
        assert (packed in text) == (not strided), rows
        if rows in (1, None):
            _assert_matches_reference(graph, CpuBackend().compile(graph), BATCHES, dtype)
