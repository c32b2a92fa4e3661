"""Large element-wise passes on threads after update fusion (codegen/parallel_maps.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends.cpu import THREAD_PASS, CpuBackend, lower
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen.parallel_maps import COLUMN_STEP, PARALLEL_MAP, PARALLEL_MAP_ROWS, spread_maps
from mlir_nn.egraph.cache import optimize_cached
from mlir_nn.ir import Graph, make_node
from mlir_nn.support.cpu_target import data_cache_bytes
from mlir_nn.support.pipelines import Pipeline, load_pipeline
from tests.egraph.util import random_arguments, trace_mlp

_MAPS = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @maps(%a: memref<SHAPE>, %b: memref<SHAPE>, %n: index) {
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<SHAPE>) outs(%b : memref<SHAPE>) {
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  scf.forall (%i) in (%n) {
    linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%a : memref<SHAPE>) outs(%b : memref<SHAPE>) {
    ^bb0(%x: f32, %y: f32):
      %s = arith.mulf %x, %y : f32
      linalg.yield %s : f32
    }
  }
  return
}
"""


def _spread(source: str, spread: int) -> str:
    """The text of ``source`` after ``spread_maps``, which spread ``spread`` ops (the module verified)."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(source)
        assert spread_maps(module) == spread
        assert module.operation.verify()
        return str(module)


@pytest.mark.parametrize("shape, spread, rows", [
    ("64x1024xf32", 1, PARALLEL_MAP_ROWS), ("?x512xf32", 1, PARALLEL_MAP_ROWS), ("64x256xf32", 0, None),
    ("32x1024xf32", 0, None), ("64x?xf32", 0, None), ("?x100xf32", 1, 164),  # a dynamic batch: counted at run time
    ("300x100xf32", 1, 164),  # static short rows: blocks of ceil(PARALLEL_MAP_MIN / 100) rows
])
def test_only_large_maps_not_yet_on_threads_are_spread(shape, spread, rows):
    text = _spread(_MAPS.replace("SHAPE", shape), spread)
    assert text.count("scf.forall") == 1 + spread
    assert ("(d0 * " in text) == bool(spread) and (rows is None or f"(d0 * {rows})" in text)  # a row block's offset


_SHORT = """
#x0 = affine_map<(d0, d1) -> (d0, 0)>
#x1 = affine_map<(d0, d1) -> (d0, 1)>
#x2 = affine_map<(d0, d1) -> (d0, 2)>
#w0 = affine_map<(d0, d1) -> (0, d1)>
#w1 = affine_map<(d0, d1) -> (1, d1)>
#w2 = affine_map<(d0, d1) -> (2, d1)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @short(%x: memref<?x3xf32>, %w: memref<3xNxf32>, %out: memref<?xNxf32>) {
  linalg.generic {indexing_maps = [#x0, #x1, #x2, #w0, #w1, #w2, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %x, %x, %w, %w, %w : memref<?x3xf32>, memref<?x3xf32>, memref<?x3xf32>, memref<3xNxf32>,
          memref<3xNxf32>, memref<3xNxf32>) outs(%out : memref<?xNxf32>) {
  ^bb0(%a0: f32, %a1: f32, %a2: f32, %b0: f32, %b1: f32, %b2: f32, %o: f32):
    %p0 = arith.mulf %a0, %b0 : f32
    %p1 = arith.mulf %a1, %b1 : f32
    %p2 = arith.mulf %a2, %b2 : f32
    %s0 = arith.addf %p0, %p1 : f32
    %s1 = arith.addf %s0, %p2 : f32
    linalg.yield %s1 : f32
  }
  return
}
"""


@pytest.mark.parametrize("columns", [4096, 4000, 1000, 520])
def test_short_products_whose_b_outgrows_l1_run_in_column_tasks(columns):
    """A short product (k = 3 here) whose op(B) takes more than half of L1 runs in tasks of
    columns, each slice of op(B) at most half of L1, whole vectors wide; op(B)'s rows 4 KiB apart
    (4096 floats) are read from a copy one cache line longer a row (``row_pitch``). A smaller
    op(B) keeps tasks of rows."""
    budget = data_cache_bytes()[1] // 2
    text = _spread(_SHORT.replace("N", str(columns)), 1)
    if 3 * columns * 4 <= budget:
        assert f"(d0 * {PARALLEL_MAP_ROWS})" in text and "memref.alloc" not in text
        return
    width = int(re.search(r"\(d0 \* (\d+)\)", text).group(1))
    assert width % COLUMN_STEP == 0 and 3 * width * 4 <= budget + 3 * COLUMN_STEP * 4 and width < columns
    copied = f"memref.alloc() : memref<3x{columns + 16}xf32>" in text
    assert copied == (columns == 4096) and (text.count("linalg.copy") == int(copied))


def test_a_buffer_the_step_made_for_op_b_gets_the_longer_rows_itself():
    """op(B) that the step wrote itself (the transposed copy of a (n, k) weight) is allocated with
    rows one cache line longer, which its writer fills: no second copy."""
    transpose = """
#t = affine_map<(d0, d1) -> (d1, d0)>
#i = affine_map<(d0, d1) -> (d0, d1)>
func.func @short(%x: memref<?x3xf32>, %v: memref<4096x3xf32>, %out: memref<?x4096xf32>) {
  %w = memref.alloc() : memref<3x4096xf32>
  linalg.generic {indexing_maps = [#t, #i], iterator_types = ["parallel", "parallel"]}
      ins(%v : memref<4096x3xf32>) outs(%w : memref<3x4096xf32>) {
  ^bb0(%a: f32, %b: f32):
    linalg.yield %a : f32
  }
"""
    body = _SHORT.replace("N", "4096").split("func.func @short(%x: memref<?x3xf32>, %w: memref<3x4096xf32>, "
                                             "%out: memref<?x4096xf32>) {\n")
    text = _spread(body[0] + transpose + body[1], 1)
    assert "linalg.copy" not in text and "memref.alloc() : memref<3x4112xf32>" in text
    assert "memref.alloc() : memref<3x4096xf32>" not in text


_COPY = """
func.func @copy(%a: memref<SHAPE, strided<[150, 1]>>, %c: f32, %b: memref<SHAPE, strided<[32, 1]>>) {
  linalg.copy ins(%a : memref<SHAPE, strided<[150, 1]>>) outs(%b : memref<SHAPE, strided<[32, 1]>>)
  linalg.fill ins(%c : f32) outs(%b : memref<SHAPE, strided<[32, 1]>>)
  return
}
"""


@pytest.mark.parametrize("shape, spread, rows", [
    ("25600x22xf32", 1, 745),  # a product's last column panel: blocks of ceil(PARALLEL_MAP_MIN / 22) rows
    ("700x22xf32", 0, None),  # one task's worth
    # short rows of a dynamic count: as many blocks as the batch needs, the fill too (an
    # accumulator zeroed in the row blocks whose product tasks then add into it)
    ("?x22xf32", 2, 745),
])
def test_large_2d_copies_are_spread_and_fills_only_over_a_dynamic_batch(shape, spread, rows):
    text = _spread(_COPY.replace("SHAPE", shape), spread)
    assert text.count("scf.forall") == spread and (rows is None or f"(d0 * {rows})" in text)


_RANK_4 = """
#in = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, IN, d3)>
#win = affine_map<(d0, d1, d2, d3, d4) -> (d4)>
#out = affine_map<(d0, d1, d2, d3, d4) -> (OUT)>
func.func @passes(%a: memref<Lx8xROWSx16xf32>, %w: memref<2xf32>, %c: memref<OUTSHAPExf32>, %b: memref<Lx8x16x16xf32>) {
  linalg.generic {indexing_maps = [#in, #win, #out],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%a, %w : memref<Lx8xROWSx16xf32>, memref<2xf32>) outs(%c : memref<OUTSHAPExf32>) {
  ^bb0(%x: f32, %unused: f32, %y: f32):
    %s = arith.maximumf %x, %y : f32
    linalg.yield %s : f32
  }
  linalg.copy ins(%b : memref<Lx8x16x16xf32>) outs(%b : memref<Lx8x16x16xf32>)
  return
}
"""


@pytest.mark.parametrize("lead, read, out, out_shape, spread, blocks", [
    # the generic reads 2 elements an output (4096 a leading index): tasks of 4 indices; the
    # copy writes 2048 an index: tasks of 8
    ("?", "d2", "d0, d1, d2, d3", "?x8x16x16", 2, ["(d0 * 4)", "(d0 * 8)"]),  # a dynamic batch
    ("9", "d2", "d0, d1, d2, d3", "9x8x16x16", 2, ["(d0 * 4)", "(d0 * 8)"]),
    ("8", "d2", "d0, d1, d2, d3", "8x8x16x16", 1, ["(d0 * 4)"]),  # the copy: one task's worth, serial
    ("4", "d2", "d0, d1, d2, d3", "4x8x16x16", 0, []),  # both one task's worth
    ("9", "d2 + d4", "d0, d1, d2, d3", "9x8x16x16", 2, ["(d0 * 4)", "(d0 * 8)"]),  # a window read (pooling)
    ("9", "3", "d0, d1, d2, d3", "9x8x16x16", 2, ["(d0 * 4)", "(d0 * 8)"]),  # a constant index (a tap's weight)
    # the output leads with loop 1: split over it, in tasks of ceil(PARALLEL_MAP_MIN / (9 x 16 x 16 x 2)) = 4 indices
    ("9", "d2", "d1, d0, d2, d3", "8x9x16x16", 2, ["(d0 * 4)", "(d0 * 8)"]),
    # a sum over loop 0 into one row per loop-1 index (a bias gradient per channel)
    ("9", "d2", "d1, 0, 0, 0", "8x1x1x1", 2, ["(d0 * 4)", "(d0 * 8)"]),
    ("9", "d2", "0, 0, 0, 0", "1x1x1x1", 1, ["(d0 * 8)"]),  # a sum over every loop: only the copy
])
def test_passes_over_rank_4_buffers_are_spread(lead, read, out, out_shape, spread, blocks):
    with ir.Context(), ir.Location.unknown():
        rows = "17" if "+" in read else "16"
        text = _RANK_4.replace("Lx", lead + "x").replace("ROWS", rows).replace("IN", read)
        module = ir.Module.parse(text.replace("OUTSHAPE", out_shape).replace("OUT", out))
        assert spread_maps(module) == spread
        assert module.operation.verify()
        text = str(module)
    assert text.count("scf.forall") == spread
    assert sorted(set(re.findall(r"\(d0 \* \d+\)", text))) == blocks  # each spread pass's block offset


@pytest.mark.parametrize("lead, threads, spread, blocks", [
    ("9", 2, 2, ["(d0 * 5)", "(d0 * 8)"]),  # the generic: 5 and 4 indices, not 4, 4 and 1
    ("9", 4, 2, ["(d0 * 4)", "(d0 * 8)"]),  # blocks of 3 would be under a task's worth
    ("9", 1, 0, []),  # one thread: no pass in tasks
    ("33", 2, 2, ["(d0 * 17)"]),
    ("?", 2, 2, ["(d0 * 4)", "(d0 * 8)"]),  # a dynamic batch: blocks counted at run time as before
])
def test_static_passes_have_at_most_one_block_a_thread(lead, threads, spread, blocks):
    """With the computing threads given, a pass over a static leading dim is cut into at most
    that many blocks (one task each), so that the caller and each pool thread take one."""
    with ir.Context(), ir.Location.unknown():
        text = _RANK_4.replace("OUTSHAPE", "Lx8x16x16").replace("Lx", lead + "x").replace("ROWS", "16")
        module = ir.Module.parse(text.replace("IN", "d2").replace("OUT", "d0, d1, d2, d3"))
        assert spread_maps(module, threads) == spread
        assert module.operation.verify()
        text = str(module)
    assert sorted(set(re.findall(r"\(d0 \* \d+\)", text))) == blocks


_ROW_STATS = """
#in = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#out = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
func.func @stats(%x: memref<ROWSx64xWIDTHxf32>, %s: memref<ROWSx64x1xf32>) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x : memref<ROWSx64xWIDTHxf32>) outs(%s : memref<ROWSx64x1xf32>) {
  ^bb0(%v: f32, %t: f32):
    %a = arith.addf %v, %t : f32
    linalg.yield %a : f32
  }
  return
}
"""


@pytest.mark.parametrize("rows, width, block", [
    ("32", "64", 4),  # a LayerNorm's (32, 64, 64) -> (32, 64, 1): 4096 elements read an index, 64 written
    ("?", "64", 4), ("5", "64", 4), ("4", "64", None),  # one task's worth: serial
    ("32", "256", 1), ("2", "256", 1), ("1", "256", None),
])
def test_row_statistics_are_sized_by_the_elements_they_read(rows, width, block):
    """Row statistics write one element a row: sized by their outputs (64 an index), they
    looked like one task's worth and ran serial between passes on threads."""
    text = _spread(_ROW_STATS.replace("ROWS", rows).replace("WIDTH", width), int(block is not None))
    assert block is None or f"{PARALLEL_MAP} = array<i64: {block}>" in text  # rows a task
def _adam_graph(widths: list[int]):
    graph, _, _ = trace_mlp(widths, 8, "--optimizer", "adam", dtype="float32")
    return optimize_cached(graph, 8)[0]


def test_a_large_adam_update_is_one_pass_on_threads():
    """Adam's update of a 64 x 1024 weight reads p, g, m and v and writes p, m and v in one
    threaded pass over row blocks (tiled before fusion, it was one threaded pass per op)."""
    graph = _adam_graph([64, 1024, 7])
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("scf-forall-to-parallel"))
    threads = next(p for p in shipped.passes if p.startswith(THREAD_PASS))  # (no scf.forall becomes its loop)
    module, _, _ = lower(graph, Pipeline("until-threads", (*shipped.passes[:cut], threads)))
    lines = str(module).splitlines()
    block = f"memref<{PARALLEL_MAP_ROWS}x1024xf32"
    updates = [line for line in lines if "linalg.generic" in line and line.split("outs(")[-1].count(block) == 3]
    assert len(updates) == 1  # p, m and v of a row block written by one generic
    maps = [line for line in lines if "linalg.generic" in line and block in line.split("outs(")[-1]]
    assert maps == updates  # no other element-wise pass over the weight's row blocks


def test_large_adam_steps_match_the_reference_at_awkward_sizes():
    """(The random moments make some updates large and a few ill-conditioned: differences are
    measured against each array's largest value.)"""
    graph = _adam_graph([64, 1024, 7])
    executable = CpuBackend().compile(graph)
    slot = {p.attr("name"): i for i, p in enumerate(graph.params)}
    for batch in (1, 7, 13, 33, 257, 4099):
        inputs, params = random_arguments(graph, batch, np.random.default_rng(batch))
        inputs = [a.astype(n.dtype) for a, n in zip(inputs, graph.inputs)]
        params = [np.asarray(a, dtype=n.dtype) for a, n in zip(params, graph.params)]
        want, updates = evaluate(graph, inputs, [p.copy() for p in params], batch)
        got = executable.run(inputs, params)
        for value, expected in zip(got, want):
            np.testing.assert_allclose(value, expected, rtol=2e-5, atol=1e-5 * np.abs(expected).max(),
                                       err_msg=f"output, batch {batch}")
        for (name, _), expected in zip(graph.updates, updates):
            np.testing.assert_allclose(params[slot[name]], expected, rtol=2e-5, atol=1e-5 * np.abs(expected).max(),
                                       err_msg=f"{name}, batch {batch}")


def _row_ops_graph(dtype: str) -> Graph:
    """LayerNorm, softmax and their gradients along the last axis of (N, 64, 64) and causal
    attention scores (N, 4, 32, 32): row statistics reading 4096 elements a leading index."""
    x, g = (make_node("input", [], name=n, shape=("N", 64, 64), dtype=dtype) for n in "xg")
    a = make_node("input", [], name="a", shape=("N", 4, 32, 32), dtype=dtype)
    y = make_node("softmax", [x], axis=2)
    c = make_node("softmax", [a], axis=3, causal=True)
    outs = (y, make_node("softmax_grad", [y, g], axis=2), make_node("layer_norm", [x], eps=1e-5),
            make_node("layer_norm_grad", [x, g], eps=1e-5), c, make_node("softmax_grad", [c, a], axis=3, causal=True))
    return Graph((x, g, a), (), outs, name="row_stats")


def test_row_statistics_run_in_tasks_of_four_leading_indices():
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("scf-forall-to-parallel"))
    threads = next(p for p in shipped.passes if p.startswith(THREAD_PASS))
    module, _, _ = lower(_row_ops_graph("float32"), Pipeline("until-threads", (*shipped.passes[:cut], threads)))
    stats = [line for line in str(module).splitlines() if "linalg.generic" in line and "reduction" in line]
    assert len(stats) >= 12  # (sized by their outputs: tasks of 256 indices, one task at these batches)
    assert all(f"{PARALLEL_MAP} = array<i64: 4>" in line for line in stats)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float64", 1e-12)])  # (float32: y (g - sum(y g)) cancels)
def test_row_statistics_on_threads_match_the_reference_at_awkward_sizes(dtype, tol):
    graph = _row_ops_graph(dtype)
    executable = CpuBackend().compile(graph)
    for rows in (1, 7, 33, 65):
        rng = np.random.default_rng(rows)
        inputs = [(rng.standard_normal((rows, *n.shape[1:])) * 3.0 + 1.0).astype(dtype) for n in graph.inputs]
        want = evaluate(graph, inputs, [], rows)[0]
        for i, (got, expected) in enumerate(zip(executable.run(inputs, []), want)):
            scale = max(1.0, float(np.abs(expected).max()))
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale, err_msg=f"output {i}, {rows} rows")


_ROWS_2D = """
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (OUTMAP)>
func.func @stats(%x: memref<ROWSxWIDTHxf32>, %s: memref<OUTSHAPExf32>) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = [ITERATORS]}
      ins(%x : memref<ROWSxWIDTHxf32>) outs(%s : memref<OUTSHAPExf32>) {
  ^bb0(%v: f32, %t: f32):
    %a = arith.addf %v, %t : f32
    linalg.yield %a : f32
  }
  return
}
"""


@pytest.mark.parametrize("rows, width, out, block", [
    ("2048", "96", "d0, 0", 171),  # a loss's row statistics over 96 classes: tasks of ceil(PARALLEL_MAP_MIN / 96) rows
    ("2048", "96", "d0", 171), ("?", "96", "d0", 171), ("171", "96", "d0", None),  # one task's worth
    ("2048", "1000", "d0, 0", PARALLEL_MAP_ROWS),  # long rows: PARALLEL_MAP_ROWS a task, as element-wise passes
    ("2048", "96", "d1", None),  # a sum over the rows (a bias gradient): not split here
])
def test_2d_row_reductions_are_spread_over_rows(rows, width, out, block):
    shape = {"d0, 0": f"{rows}x1", "d0": rows, "d1": width}[out]
    iterators = '"reduction", "parallel"' if out == "d1" else '"parallel", "reduction"'
    source = _ROWS_2D.replace("OUTSHAPE", shape).replace("ROWS", rows).replace("WIDTH", width)
    text = _spread(source.replace("OUTMAP", out).replace("ITERATORS", iterators), int(block is not None))
    assert block is None or f"{PARALLEL_MAP} = array<i64: {block}>" in text
