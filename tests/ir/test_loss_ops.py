"""The ops the losses are written with (masks, abs/sign, maximum/minimum, softplus): gradients
against float64 finite differences, values and gradients against PyTorch, and their lowering
(cpu compiled, cuda by the SIMT emulation) against the reference."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mlir_nn
from mlir_nn.engine import Tensor, apply
from tests.gradcheck import check_grads
from tests.ir.test_ops import arr, broadcast_pair, shapes

TORCH = {"abs": torch.abs, "softplus": torch.nn.functional.softplus, "maximum": torch.maximum,
         "minimum": torch.minimum, "sign": torch.sign}


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@given(pair=broadcast_pair())
def test_extremum_grads(op, pair):
    check_grads(lambda x, y: apply(op, x, y), [arr(pair[0], seed=1), arr(pair[1], seed=2)])


@pytest.mark.parametrize("op", ["abs", "softplus"])
@given(shape=shapes)
def test_unary_grads(op, shape):
    x = arr(shape, -4, 4)
    x[np.abs(x) < 0.05] = 0.5  # away from abs's kink
    check_grads(lambda t: apply(op, t), [x])


@pytest.mark.parametrize("op", ["abs", "softplus", "sign", "maximum", "minimum"])
def test_values_and_gradients_equal_pytorch(op):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((5, 3)) * 30, rng.standard_normal((3,)) * 30]
    xs[0][0, 0] = 0.0
    xs[0][1, :] = xs[1]  # ties between maximum's operands share the gradient
    operands = xs if op in ("maximum", "minimum") else xs[:1]
    ours = [Tensor(x) for x in operands]
    theirs = [torch.tensor(x, requires_grad=True) for x in operands]
    out, expected = apply(op, *ours), TORCH[op](*theirs)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    if op != "sign":
        weight = rng.standard_normal(out.shape)
        (out * Tensor(weight)).sum().backward()
        (expected * torch.tensor(weight)).sum().backward()
        for t, u in zip(ours, theirs):
            np.testing.assert_allclose(t.grad, u.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_masks_and_sign_have_no_gradient():
    x = Tensor(np.array([-1.0, 0.0, 2.0]))
    np.testing.assert_array_equal((x > 0).data, [0, 0, 1])
    np.testing.assert_array_equal((x >= 0).data, [0, 1, 1])
    np.testing.assert_array_equal((x < 0).data, [1, 0, 0])
    np.testing.assert_array_equal((x <= 0).data, [1, 1, 0])
    ((x > 0) * x + apply("sign", x) * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [-1, 0, 2])  # (x > 0) + sign(x): only through the products


def test_softplus_is_finite_for_any_finite_input():
    x = np.array([-1e308, -800.0, -30.0, 0.0, 30.0, 800.0, 1e308])
    out = apply("softplus", Tensor(x)).data
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, torch.nn.functional.softplus(torch.tensor(x)).numpy(), rtol=1e-13)


def _ops_step(w):
    def step(x, y):
        a = apply("maximum", x * w, y) + apply("minimum", x, 0.5) + apply("abs", x - y)
        b = apply("softplus", x * 40.0) + apply("sign", y) + (x > y) + (x >= 0.25) + (x < y)
        loss = (a * b).mean()
        loss.backward()
        with mlir_nn.no_grad():
            w.data -= 0.1 * w.grad
        return loss, a, b
    return step


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@settings(max_examples=3, deadline=None)
@given(batch=st.sampled_from([1, 4, 9]), seed=st.integers(0, 2**31))
def test_ops_compile_and_match_eager(backend, batch, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((batch, 3)), rng.standard_normal((batch, 3))
    x[0, 0] = y[0, 0]  # a tie
    w_eager, w_jit = Tensor(rng.standard_normal(3)), None
    w_jit = Tensor(w_eager.data.copy())
    want = _ops_step(w_eager)(Tensor(x), Tensor(y))
    got = mlir_nn.jit(_ops_step(w_jit), backend=backend, tiered=False)(x, y)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e.data, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(w_jit.data, w_eager.data, rtol=1e-9, atol=1e-11)


def test_ops_run_in_the_cuda_emulation():
    from mlir_nn.backends.reference import evaluate
    from mlir_nn.jit import trace_step
    from tests.gpu.test_emulate import emulated

    w = Tensor(np.array([0.5, -1.0, 2.0], np.float32))
    graph, captured, _ = trace_step(_ops_step(w), [np.zeros((4, 3), np.float32)] * 2, ["x", "y"])
    step = emulated(graph)
    rng = np.random.default_rng(0)
    params = [np.array(t.data, np.float32) for t in captured]
    for batch in (4, 1):
        x, y = (rng.standard_normal((batch, 3)).astype(np.float32) for _ in range(2))
        outputs, updates = evaluate(graph, [x, y], [p.copy() for p in params], batch)
        want = [np.asarray(v) for v in outputs + updates]
        got = step.run([x, y] + params, [v.shape for v in want], np.float32)
        for g, v in zip(got, want):
            np.testing.assert_allclose(g, v, rtol=2e-5, atol=2e-6)
