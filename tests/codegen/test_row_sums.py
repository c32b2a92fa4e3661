"""Sums over the batch of narrow tensors (bias gradients) as vector code with register totals.

Checked against float64 sums: the float32 reference adds rows one after the other along the
batch (NumPy's pairwise summation is along contiguous memory only), 3e-6 off at 4099 rows,
where the compiled float64 totals are within 1e-7."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.row_sums import ROW_SUM, ROW_SUM_MAX, SUM_TASK_ELEMENTS, WIDE_SUM_MAX, tag_row_sums
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node

ROWS = (1, 7, 13, 33, 257, 4099)
TOL = {"float32": 2e-7, "float64": 1e-13}  # of the largest total


def _sums(width: int, dtype: str) -> Graph:
    """sum_to over the batch, and the same over a product's output (a bias gradient's shape)."""
    x = make_node("input", [], name="x", shape=("N", width), dtype=dtype)
    scale = make_node("param", [], name="s", shape=(width,), dtype=dtype)
    outs = (make_node("sum_to", [x], shape=(width,)),
            make_node("sum_to", [make_node("mul", [x, scale])], shape=(1, width)))
    return Graph((x,), (scale,), outs, name="row_sums")


@pytest.mark.parametrize("width, dtype", [(1, "float32"), (32, "float32"), (ROW_SUM_MAX, "float32"),
                                          (13, "float64"), (ROW_SUM_MAX + 1, "float32")])
def test_row_sums_are_tagged_and_match_the_reference(width, dtype):
    graph = _sums(width, dtype)
    assert tag_row_sums(emit_linalg(graph, wide_sums=True)) == (2 if width <= ROW_SUM_MAX else 0)
    executable = CpuBackend().compile(graph)
    for rows in ROWS:
        rng = np.random.default_rng(rows)
        x = rng.standard_normal((rows, width)).astype(dtype) + 3.0  # totals far from zero: a relative check
        scale = rng.standard_normal(width).astype(dtype)
        truths = [x.astype(np.float64).sum(0), (x * scale).astype(np.float64).sum(0)]
        for got, truth in zip(executable.run([x], [scale]), truths):
            assert got.dtype == dtype and got.size == width
            error = np.abs(got.ravel() - truth).max() / np.abs(truth).max()
            assert error <= TOL[dtype], f"{rows} rows of {width}: {error:.2g} off"


def _check_totals(executable, width: int, dtype: str, batches: tuple[int, ...]) -> None:
    """The compiled sums of ``_sums`` match the float64 totals at each batch (totals far from zero)."""
    for rows in batches:
        rng = np.random.default_rng(rows)
        x = rng.standard_normal((rows, width)).astype(dtype) + 3.0
        scale = rng.standard_normal(width).astype(dtype)
        truths = [x.astype(np.float64).sum(0), (x * scale).astype(np.float64).sum(0)]
        for got, truth in zip(executable.run([x], [scale]), truths):
            error = np.abs(got.ravel() - truth).max() / np.abs(truth).max()
            assert error <= TOL[dtype], f"{rows} rows of {width}: {error:.2g} off"


@pytest.mark.parametrize("width, dtype", [(48, "float32"), (13, "float64")])
def test_row_sums_over_a_large_batch_run_in_tasks_of_partial_totals(width, dtype):
    """With threads, a sum over the batch runs as tasks over row ranges of at least
    SUM_TASK_ELEMENTS elements, each into a partial total, added at the end (one task, run in
    place, for a small batch). Every batch, up to eight tasks' worth, matches the float64 totals."""
    graph = _sums(width, dtype)
    module = emit_linalg(graph, wide_sums=True)
    assert tag_row_sums(module, threads=True) == 2
    foralls = collect_ops(module, lambda op: op.name == "scf.forall")
    assert len(foralls) == 2 and all(ROW_SUM in op.attributes for f in foralls for op in _generics(f))
    executable = CpuBackend().compile(graph)
    rows_min = -(-SUM_TASK_ELEMENTS // width)
    _check_totals(executable, width, dtype, (1, 7, rows_min - 1, 2 * rows_min + 5, 9 * rows_min + 3))


@pytest.mark.parametrize("width, dtype", [(100, "float32"), (1024, "float32"), (300, "float64")])
def test_wide_sums_over_the_batch_run_in_tasks_of_partial_totals(width, dtype):
    """Sums with more totals than registers hold (untagged: their loops keep the totals in
    memory) go into the same tasks of rows on threads (a 1024-wide bias gradient at batch 512
    ran on one thread), and match the float64 totals at every batch."""
    assert ROW_SUM_MAX < width <= WIDE_SUM_MAX
    graph = _sums(width, dtype)
    module = emit_linalg(graph, wide_sums=True)
    assert tag_row_sums(module, threads=True) == 0
    foralls = collect_ops(module, lambda op: op.name == "scf.forall")
    assert len(foralls) == 2 and not any(ROW_SUM in op.attributes for f in foralls for op in _generics(f))
    executable = CpuBackend().compile(graph)
    rows_min = -(-SUM_TASK_ELEMENTS // width)
    _check_totals(executable, width, dtype, (*ROWS, rows_min + 1, 9 * rows_min + 3))


def test_a_max_over_the_batch_keeps_one_loop():
    """A max over the batch has the same shape as a sum, but its partial results could not be
    added: it stays one loop on threads, and matches the reference (it was -inf at one row)."""
    x = make_node("input", [], name="x", shape=("N", 16), dtype="float32")
    graph = Graph((x,), (), (make_node("max", [x], axes=(0,), keepdims=False),), name="row_max")
    module = emit_linalg(graph, wide_sums=True)
    assert tag_row_sums(module, threads=True) == 1
    assert not collect_ops(module, lambda op: op.name == "scf.forall")
    executable = CpuBackend().compile(graph)
    for rows in (1, 13, 9 * SUM_TASK_ELEMENTS // 16 + 3):
        x_value = np.random.default_rng(rows).standard_normal((rows, 16)).astype("float32")
        np.testing.assert_array_equal(executable.run([x_value], [])[0], x_value.max(0))


def _generics(forall: ir.Operation) -> list[ir.Operation]:
    """The linalg.generic ops inside ``forall``."""
    return collect_ops(forall, lambda op: op.name == "linalg.generic")


@pytest.mark.parametrize("width, dtype", [(1, "float32"), (32, "float32"), (13, "float64")])
def test_the_quick_tier_sums_in_plain_loops_that_match_the_reference(width, dtype):
    """The quick tier (LLVM at -O0, ``rewrite_matmuls(quick=True)``) leaves the sums untagged: plain
    loops, no vector code, as exact as the tagged ones at every batch size."""
    from mlir_nn.backends.cpu import CpuExecutable, compile_kernel, serial_pipeline
    from mlir_nn.support.pipelines import load_pipeline

    graph = _sums(width, dtype)
    kernel = compile_kernel(graph, serial_pipeline(load_pipeline("cpu")), use_disk=False, opt_level=0,
                            workers=False)
    assert "vector<" not in kernel.stages["llvm"]
    _check_totals(CpuExecutable(graph, kernel), width, dtype, ROWS)
