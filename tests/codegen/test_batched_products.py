"""Compiled batched products (a loop of 2-D products) against PyTorch in float64: awkward sizes,
operands read through transposes of their last two axes, 4-D operands, and a dynamic batch."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mlir_nn
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.batched_products import batch_tasks
from mlir_nn.codegen.cpu_matmul import SWAPPED_LOOP_MAX
from mlir_nn.codegen.schedule_report import product_schedules
from mlir_nn.engine import Tensor
from mlir_nn.jit.trace import trace_step
from tests.holder import Holder

SIZES = [(1, 1, 1, 1), (1, 7, 13, 33), (3, 13, 1, 7), (2, 33, 7, 13), (5, 7, 33, 1), (4, 64, 16, 64),
         (3, 64, 64, 16), (2, 33, 47, 5)]


def _compiled(f, *arrays, dynamic_batch=False):
    """f's value and the gradients of a weighted sum of it, compiled for the CPU."""
    rng = np.random.default_rng(5)
    params = [Tensor(a) for a in arrays]
    weight = Tensor(rng.standard_normal(f(*params).shape))

    holder = Holder(params)

    def step(scale):
        holder.parameters()
        out = f(*params) * scale
        (out * weight).sum().backward()
        result = [out] + [p._grad for p in params]
        for p in params:
            p.grad = None
        return result

    kwargs = {} if dynamic_batch else {"dynamic_batch": False}
    got = mlir_nn.jit(step, backend="cpu", tiered=False, **kwargs)(np.ones((1, 1)))
    torch_params = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = f(*torch_params)
    (out * torch.tensor(weight.data)).sum().backward()
    return got, [out.detach().numpy()] + [p.grad.numpy() for p in torch_params]


def _close(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_bmm_equals_pytorch(sizes, layout):
    batch, m, k, n = sizes
    rng = np.random.default_rng(sum(sizes))
    a = rng.standard_normal((batch, k, m) if layout[0] == "t" else (batch, m, k))
    b = rng.standard_normal((batch, n, k) if layout[1] == "t" else (batch, k, n))

    def f(x, y):
        x = x.transpose(1, 2) if layout[0] == "t" else x
        y = y.transpose(1, 2) if layout[1] == "t" else y
        return x @ y

    _close(*_compiled(f, a, b))


def test_4d_attention_products_equal_pytorch():
    """softmax(q @ k^T) @ v over (batch, heads, time, head width)."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 13, 7)) for _ in range(3))
    _close(*_compiled(lambda q, k, v: (q @ k.transpose(-2, -1)).softmax(-1) @ v, q, k, v))


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.booleans())
def test_bmm_hypothesis_shapes(batch, m, k, n, flip):
    rng = np.random.default_rng(batch * 1000 + m * 100 + k * 10 + n)
    a = rng.standard_normal((batch, m, k))
    b = rng.standard_normal((batch, n, k) if flip else (batch, k, n))
    _close(*_compiled(lambda x, y: x @ (y.transpose(1, 2) if flip else y), a, b))


def _matches_torch_over_batches(forward, weight: np.ndarray, shapes: list[tuple[int, ...]], rng) -> None:
    """``forward(x, w)`` and the gradient of its sum of squares in ``w``, compiled once for any
    batch, at inputs of each of ``shapes`` against PyTorch."""
    w = Tensor(weight)
    holder = Holder([w])

    def step(x):
        holder.parameters()
        out = forward(x, w)
        (out * out).sum().backward()
        grad = w._grad
        w.grad = None
        return [out, grad]

    compiled = mlir_nn.jit(step, backend="cpu", tiered=False)
    for shape in shapes:
        x = rng.standard_normal(shape)
        tw = torch.tensor(weight, requires_grad=True)
        out = forward(torch.tensor(x), tw)
        (out * out).sum().backward()
        _close(compiled(x), [out.detach().numpy(), tw.grad.numpy()])


def test_bmm_over_a_dynamic_batch_equals_pytorch():
    """One compiled step over inputs of 3 and then 5 rows: the batch loop's count is the run-time batch."""
    rng = np.random.default_rng(11)

    def forward(x, w):
        h = x * w
        return h @ h.transpose(1, 2)

    _matches_torch_over_batches(forward, rng.standard_normal((7, 13)), [(3, 7, 13), (5, 7, 13)], rng)


@pytest.mark.parametrize("sizes", [(3, 64, 64, 16), (2, 33, 47, 5)], ids=lambda s: "x".join(map(str, s)))
def test_small_static_products_with_few_columns_loop_instead_of_packing(sizes):
    """A per-matrix product (attention's 64x16x64) that would run swapped with at most
    SWAPPED_LOOP_MAX work is a vector loop nest: no packing of both operands per matrix."""
    batch, m, k, n = sizes
    a, b = np.zeros((batch, m, k), np.float32), np.zeros((batch, k, n), np.float32)
    graph, _, _ = trace_step(lambda x, y: x @ y, [a, b], ["a", "b"], dynamic_batch=False)
    report = product_schedules(emit_linalg(graph, strided_copies=True))
    assert [(s.m, s.n, s.k) for s in report] == [(m, n, k)] and m * n * k <= SWAPPED_LOOP_MAX
    assert report[0].schedule != "blocked-swapped", report[0]


@pytest.mark.parametrize(("count", "tasks"), [(1, 1), (7, 7), (12, 6), (13, 1), (33, 3), (128, 8)])
def test_batch_loops_split_into_equal_tasks(count, tasks):
    assert batch_tasks(count) == tasks


def test_batch_loops_run_as_tasks_only_when_asked():
    a, b = np.zeros((12, 64, 16), np.float32), np.zeros((12, 64, 16), np.float32)
    graph, _, _ = trace_step(lambda x, y: x @ y.transpose(1, 2), [a, b], ["a", "b"], dynamic_batch=False)
    on_tasks = str(emit_linalg(graph, strided_copies=True, batch_tasks=True))
    assert on_tasks.count("scf.forall (") == 1 and "tensor.parallel_insert_slice" in on_tasks
    assert "scf.forall" not in str(emit_linalg(graph, strided_copies=True))


@pytest.mark.parametrize("sizes", [(12, 64, 16, 64), (6, 33, 8, 16), (16, 8, 24, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_row_block_products_on_tasks_equal_pytorch(sizes):
    """Batch loops in tasks of several matrices whose products are register blocks of rows, B^T
    copied per matrix into a buffer of each task's own."""
    batch, m, k, n = sizes
    rng = np.random.default_rng(sum(sizes))
    a, b = rng.standard_normal((batch, m, k)), rng.standard_normal((batch, n, k))
    _close(*_compiled(lambda x, y: x @ y.transpose(1, 2), a, b))


HEAD_LAYOUTS = {  # (batch, time, heads, width) source -> the 4-D operand the product reads
    "split": lambda x: x.permute(0, 2, 1, 3),  # (batch, heads, time, width)
    "split-swapped": lambda x: x.permute(0, 2, 1, 3).transpose(-2, -1),  # (batch, heads, width, time)
    "width-first": lambda x: x.permute(0, 3, 1, 2),  # (batch, width, time, heads): heads last, read as before
}


@pytest.mark.parametrize(("left", "right"), [("split", "split"), ("split", "split-swapped"), ("split-swapped", "split"),
                                           ("split-swapped", "split-swapped"), ("width-first", "width-first")])
def test_products_of_heads_split_off_a_source_equal_pytorch(left, right):
    """A 4-D operand that transposes a (batch, time, heads, width) tensor is read per matrix from
    that tensor (a strided slice, no transposed copy); values and gradients equal PyTorch's."""
    rng = np.random.default_rng(len(left) * 7 + len(right))
    a, b = rng.standard_normal((2, 5, 3, 4)), rng.standard_normal((2, 5, 3, 4))
    left_of, right_of = HEAD_LAYOUTS[left], HEAD_LAYOUTS[right]

    def f(x, y):
        x, y = left_of(x), right_of(y)
        return x @ (y.transpose(-2, -1) if x.shape[-1] != y.shape[-2] else y)

    _close(*_compiled(f, a, b))
    graph, _, _ = trace_step(f, [a, b], ["a", "b"], dynamic_batch=False)
    slices = str(emit_linalg(graph, strided_copies=True)).count("tensor<2x5x3x4xf64> to tensor<")
    assert slices == (left != "width-first") + (right != "width-first")


def test_attention_over_a_dynamic_batch_reads_its_heads_from_the_source():
    """softmax(q k^T) v with q, k, v split into heads off (batch, time, heads, width) tensors, at
    two batch sizes through one compiled step, against PyTorch."""
    rng = np.random.default_rng(13)

    def attention(x, w):
        q, k, v = ((x * w * s).permute(0, 2, 1, 3) for s in (1.0, 0.5, -1.0))
        return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    _matches_torch_over_batches(attention, rng.standard_normal((5, 3, 4)), [(2, 5, 3, 4), (3, 5, 3, 4)], rng)
