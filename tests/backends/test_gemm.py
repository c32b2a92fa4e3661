"""The C GEMM of the quick tier (``backends/gemm.c``) and the quick tier's code that calls it."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from mlir_nn.backends import gemm
from mlir_nn.backends.cpu import CpuExecutable, compile_kernel, serial_pipeline
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import gemm_calls
from mlir_nn.ir import ShapeError
from mlir_nn.support.pipelines import load_pipeline
from tests.codegen.zoo import arguments, matmul_zoo, sequence_zoo

TOL = {"float32": dict(rtol=2e-4, atol=2e-5), "float64": dict(rtol=1e-9, atol=1e-11)}
BATCHES = (1, 7, 13, 33, 257, 4099)


def _descriptor(x: np.ndarray) -> list[object]:
    """``x`` as MLIR passes a memref<?x?xT, strided<[?, ?], offset: ?>>: its base array's pointer
    twice, the offset and strides in elements, the sizes."""
    base = x.base if x.base is not None else x
    offset = (x.ctypes.data - base.ctypes.data) // x.itemsize
    pointer = ctypes.c_void_p(base.ctypes.data)
    return [pointer, pointer, offset, *x.shape, *(s // x.itemsize for s in x.strides)]


def _gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, trans_a: bool, trans_b: bool) -> None:
    function = getattr(gemm.load(), gemm_calls.SYMBOLS[str(c.dtype).replace("float", "f")])
    function.argtypes = [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 5 \
        + [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p, ctypes.c_void_p] \
        + [ctypes.c_int64] * 5
    function(int(trans_a), int(trans_b), *_descriptor(a), *_descriptor(b), *_descriptor(c))


def test_the_library_defines_the_symbols_that_the_code_calls():
    assert gemm.SYMBOLS == tuple(gemm_calls.SYMBOLS.values())
    library = gemm.load()
    assert all(getattr(library, symbol) for symbol in gemm.SYMBOLS)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 3, 17), (13, 100, 3), (33, 17, 100), (257, 1, 33),
                                     (4099, 17, 3), (3, 257, 300), (100, 1100, 7)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("spacing", [1, 2])
def test_the_c_gemm_adds_the_product_to_c(m, n, k, dtype, trans_a, trans_b, spacing):
    """C += op(A) op(B) against NumPy in float64, operands as views with an offset and a column
    stride of ``spacing`` (transposed ones are read with their strides swapped: packed along
    whichever index is contiguous)."""
    rng = np.random.default_rng(m * n + k)

    def view(rows: int, columns: int) -> np.ndarray:  # a window of a larger array
        return rng.standard_normal((rows + 2, spacing * columns + 1)).astype(dtype)[1:rows + 1, 1::spacing]

    a = view(k, m) if trans_a else view(m, k)
    b = view(n, k) if trans_b else view(k, n)
    c = view(m, n)
    want = c.astype(np.float64) + (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    around = c.base.copy()
    _gemm(a, b, c, trans_a, trans_b)
    np.testing.assert_allclose(c, want, **TOL[dtype])
    outside = np.ones(around.shape, bool)
    outside[1:m + 1, 1::spacing][:, :n] = False
    np.testing.assert_array_equal(c.base[outside], around[outside])  # nothing written beside C


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, n, k", [(257, 129, 200), (25, 513, 333), (7, 2100, 300), (1, 16411, 300)])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, True)])
def test_on_two_threads_a_large_product_is_cut_in_two_halves_of_c(m, n, k, dtype, trans_a, trans_b):
    """``gemm.threads(2)``: products of 4M multiply-adds and more are cut along C's rows (two row
    panels or more) or else its columns, one half on the helper thread; both halves land where
    the product does on one thread, whatever the size (not a multiple of either panel)."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    want = c.astype(np.float64) + (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b)
    with gemm.threads(2):
        for _ in range(3):  # the helper made once, then reused
            got = c.copy()
            _gemm(a, b, got, trans_a, trans_b)
            np.testing.assert_allclose(got, want, **TOL[dtype])


def test_a_forked_child_makes_its_own_helper():
    """The helper thread is not copied by a fork: the child's two-thread products make their own."""
    import multiprocessing

    assert _threaded_product_error(5) < 1e-9  # the parent's helper exists now
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_threaded_product_error, (6,)) < 1e-9


def _threaded_product_error(seed: int) -> float:
    """The largest difference between a two-thread float64 product and NumPy's."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 300))
    c = np.zeros((300, 300))
    with gemm.threads(2):
        _gemm(a, b, c, False, False)
    return float(np.abs(c - a @ b).max())


def test_the_c_gemm_is_vector_code():
    """256 x 256 x 256 float32, the best of 20 runs: over 20 GFLOP/s (it ran at about 200 on a Zen 5
    core, NumPy's BLAS on one thread at about 120; scalar code runs at a few)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    c = np.zeros((256, 256), np.float32)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        _gemm(a, b, c, False, False)
        times.append(time.perf_counter() - start)
    assert 2 * 256 ** 3 / min(times) > 20e9


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k, m", [(1, 3), (3, 17), (17, 100), (100, 1)])
def test_the_quick_tiers_products_call_the_c_gemm_and_match_the_reference(k, m, dtype):
    """The quick tier's code (LLVM -O0, the serial pipeline) of every transpose combination and the
    fused products, at awkward widths and batches: the products are calls of the C GEMM."""
    graph = matmul_zoo(k, m, dtype)
    kernel = compile_kernel(graph, serial_pipeline(load_pipeline("cpu")), use_disk=False, opt_level=0,
                            workers=False)
    assert f"llvm.call @{gemm_calls.SYMBOLS[dtype.replace('float', 'f')]}" in kernel.stages["llvm"]
    executable = CpuExecutable(graph, kernel)
    rng = np.random.default_rng(k * m)
    for batch in BATCHES:
        inputs, params = arguments(graph, batch, rng)
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        # sums over the batch (x^T g) round as float32 sums of that length do, in another order
        tolerance = dict(TOL[dtype], atol=TOL[dtype]["atol"] * max(1.0, batch / 512))
        for got, expected in zip(executable.run(inputs, params), want):
            np.testing.assert_allclose(got, expected, **tolerance)


def test_the_quick_tiers_input_check_still_guards_its_step():
    """Bad input to the quick tier's code raises before the native code runs, parameters untouched."""
    graph = matmul_zoo(17, 3, "float32")
    kernel = compile_kernel(graph, serial_pipeline(load_pipeline("cpu")), use_disk=False, opt_level=0,
                            workers=False)
    executable = CpuExecutable(graph, kernel)
    inputs, params = arguments(graph, 13, np.random.default_rng(1))
    before = [p.copy() for p in params]
    with pytest.raises(ShapeError, match="input x"):
        executable.run([inputs[0][:, :5], *inputs[1:]], params)
    inputs[1][2, 1] = np.inf
    with pytest.raises(ValueError, match="input g contains 1 NaN or infinite"):
        executable.run(inputs, params)
    for p, q in zip(params, before):
        np.testing.assert_array_equal(p, q)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_quick_tiers_batched_products_match_the_reference(dtype):
    """A batched product (``bmm``: a loop over the batch's matrices, each a call of the C GEMM) and
    the sequence ops around it in the quick tier's code."""
    graph = sequence_zoo(dtype)
    kernel = compile_kernel(graph, serial_pipeline(load_pipeline("cpu")), use_disk=False, opt_level=0,
                            workers=False)
    assert "llvm.call @mlirnn_gemm_" in kernel.stages["llvm"]
    executable = CpuExecutable(graph, kernel)
    rng = np.random.default_rng(5)
    for batch in (1, 7, 33, 257):
        inputs = [rng.standard_normal((batch, 4, 6)).astype(dtype)]
        params = [rng.standard_normal((5, 6)).astype(dtype), rng.integers(0, 4, (3, 2)).astype(dtype),
                  rng.integers(0, 4, (batch, 4, 6)).astype(dtype)]  # table, rows, picks
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for got, expected in zip(executable.run(inputs, params), want):
            np.testing.assert_allclose(got, expected, **TOL[dtype])
