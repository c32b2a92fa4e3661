"""Small static products of a batch loop in register blocks of rows (``row_blocks``): the block
sizes, the schedule the products get, and their values and gradients against PyTorch at awkward
sizes, in float64 and float32, with each operand read plain or through a transpose."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.row_blocks import block_rows
from mlir_nn.codegen.schedule_report import product_schedules
from mlir_nn.engine import Tensor
from mlir_nn.jit.trace import trace_step
from tests.holder import Holder


@pytest.mark.parametrize(("m", "n", "k", "bits", "rows"), [
    (64, 64, 16, 32, 4),  # attention's q @ k^T: 4 vectors per row, 6 rows would fit but do not divide 64
    (64, 16, 64, 32, 8),  # p @ v: one vector per row, at most 8 rows
    (7, 33, 8, 32, 7),  # 3 vectors per row: all 7 rows
    (64, 64, 16, 64, 2),  # float64: 8 vectors per row
    (13, 5, 8, 32, None),  # no divisor of 13 up to 8 rows
    (64, 16, 13, 32, None),  # k not in whole steps
    (64, 16, 136, 32, None),  # k too long to unroll
    (8, 512, 8, 32, None),  # a row's vectors fill the registers
])
def test_block_rows(m, n, k, bits, rows):
    assert block_rows(m, n, k, bits) == rows


def _compiled(f, *arrays):
    """f's value and the gradients of a weighted sum of it, compiled for the CPU in the arrays'
    dtype, and the same from PyTorch in float64."""
    dtype = arrays[0].dtype
    rng = np.random.default_rng(5)
    params = [Tensor(a) for a in arrays]
    weight = rng.standard_normal(f(*params).shape).astype(dtype)
    holder = Holder(params)

    def step(scale):
        holder.parameters()
        out = f(*params) * scale
        (out * Tensor(weight)).sum().backward()
        result = [out] + [p._grad for p in params]
        for p in params:
            p.grad = None
        return result

    got = mlir_nn.jit(step, backend="cpu", tiered=False, dynamic_batch=False)(np.ones((1, 1), dtype))
    torch_params = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out = f(*torch_params)
    (out * torch.tensor(weight.astype(np.float64))).sum().backward()
    return got, [out.detach().numpy()] + [p.grad.numpy() for p in torch_params]


def _schedules(a: np.ndarray, b: np.ndarray, layout: str) -> list[str]:
    def f(x, y):
        return (x.transpose(1, 2) if layout[0] == "t" else x) @ (y.transpose(1, 2) if layout[1] == "t" else y)

    graph, _, _ = trace_step(f, [a, b], ["a", "b"], dynamic_batch=False)
    return [s.schedule for s in product_schedules(emit_linalg(graph, strided_copies=True))]


SIZES = [(2, 7, 8, 5), (3, 14, 24, 33), (2, 64, 16, 64), (2, 64, 64, 16), (1, 6, 16, 1), (2, 16, 32, 48),
         (1, 64, 32, 64)]


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_block_products_equal_pytorch(sizes, layout, dtype):
    batch, m, k, n = sizes
    rng = np.random.default_rng(sum(sizes) + len(layout))
    a = rng.standard_normal((batch, k, m) if layout[0] == "t" else (batch, m, k)).astype(dtype)
    b = rng.standard_normal((batch, n, k) if layout[1] == "t" else (batch, k, n)).astype(dtype)
    assert _schedules(a, b, layout) == ["row-blocks"]

    def f(x, y):
        x = x.transpose(1, 2) if layout[0] == "t" else x
        y = y.transpose(1, 2) if layout[1] == "t" else y
        return x @ y

    got, expected = _compiled(f, a, b)
    tolerance = 1e-11 if dtype == np.float64 else 1e-5
    assert len(got) == len(expected)
    for x, y in zip(got, expected):
        assert x.dtype == dtype
        np.testing.assert_allclose(x, y, rtol=tolerance, atol=tolerance * max(k, m, n))


def test_attention_products_of_a_step_run_in_row_blocks():
    """Attention's forward products and their gradients, over (batch, heads, time, head width), are
    all row-block products, and equal PyTorch's in float64."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 2, 16, 8)) for _ in range(3))
    got, expected = _compiled(lambda q, k, v: (q @ k.transpose(-2, -1)).softmax(-1) @ v, q, k, v)
    for x, y in zip(got, expected):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-11)


def test_a_product_outside_a_batch_loop_keeps_its_schedule():
    a, b = np.zeros((16, 8), np.float32), np.zeros((8, 16), np.float32)
    graph, _, _ = trace_step(lambda x, y: x @ y, [a, b], ["a", "b"], dynamic_batch=False)
    assert "row-blocks" not in [s.schedule for s in product_schedules(emit_linalg(graph, strided_copies=True))]

