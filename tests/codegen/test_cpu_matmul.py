"""The GotoBLAS-style CPU products (packed panels, kc slices, register blocks) at awkward sizes.

Every product of ``matmul_zoo`` (all transpose combinations, read-through transposes,
bias + ReLU, the folded update, the ReLU-grad mask) against the reference backend, with
row counts that leave partial register blocks (1, 7, 13, 33, 257 rows), column counts
that leave a zero-padded panel, and k not a multiple of kc (also the batch as k).
Tolerances as in tests/backends/test_cpu_parallel.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlir_nn.backends.cpu import CpuBackend, compile_kernel
from mlir_nn.backends.cpu_target import cache_blocks, register_block
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
from tests.codegen.zoo import arguments, matmul_zoo

TOL = {"float32": dict(rtol=2e-4, atol=2e-4), "float64": dict(rtol=1e-9, atol=1e-11)}
BATCHES = (1, 7, 13, 33, 257)


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
    for batch in BATCHES:
        inputs, params = arguments(graph, batch, np.random.default_rng(batch))
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for node, got, expected in zip(graph.outputs, executable.run(inputs, params), want):
            assert got.shape == expected.shape and got.dtype == expected.dtype, node
            message = f"{node.op} {dict(node.attrs)} batch {batch}"
            np.testing.assert_allclose(got, expected, **TOL[dtype], err_msg=message)


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
    from mlir_nn.backends.cpu import CpuExecutable

    for a, b in zip(CpuExecutable(graph, threaded).run(inputs, [p.copy() for p in params]),
                    CpuExecutable(graph, serial).run(inputs, [p.copy() for p in params])):
        np.testing.assert_array_equal(a, b)  # each block is summed in the same order either way
