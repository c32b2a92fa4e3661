"""Fused ops equal the chains of primitive ops they replace (NumPy reference)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError

dims = st.integers(1, 5)


def operands(m, k, n, ta, tb, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k))
    b = rng.standard_normal((n, k) if tb else (k, n))
    return Tensor(a), Tensor(b), rng


def product(a, b, ta, tb):
    return (a.T if ta else a) @ (b.T if tb else b)


@given(m=dims, k=dims, n=dims, ta=st.booleans(), tb=st.booleans(), act=st.sampled_from(["none", "relu"]))
def test_linear(m, k, n, ta, tb, act):
    a, b, rng = operands(m, k, n, ta, tb)
    bias = Tensor(rng.standard_normal(n))
    out = apply("linear", a, b, bias, activation=act, transpose_a=ta, transpose_b=tb)
    expected = product(a, b, ta, tb) + bias
    np.testing.assert_allclose(out.data, (expected.relu() if act == "relu" else expected).data, rtol=1e-12)


@given(m=dims, k=dims, n=dims, ta=st.booleans(), tb=st.booleans(),
       alpha=st.floats(-2, 2), beta=st.floats(-2, 2), subtract=st.booleans())
def test_gemm(m, k, n, ta, tb, alpha, beta, subtract):
    a, b, rng = operands(m, k, n, ta, tb)
    c = Tensor(rng.standard_normal((m, n)))
    scales = Tensor(np.float64(alpha)), Tensor(np.float64(beta))
    out = apply("gemm", a, b, c, *scales, subtract=subtract, transpose_a=ta, transpose_b=tb)
    sign = -1.0 if subtract else 1.0
    expected = (sign * alpha * product(a, b, ta, tb) + beta * c).data
    np.testing.assert_allclose(out.data, expected, rtol=1e-12, atol=1e-12)


@given(m=dims, k=dims, n=dims, ta=st.booleans(), tb=st.booleans())
def test_matmul_relu_grad(m, k, n, ta, tb):
    a, b, rng = operands(m, k, n, ta, tb)
    z = Tensor(rng.standard_normal((m, n)))
    out = apply("matmul_relu_grad", a, b, z, transpose_a=ta, transpose_b=tb)
    np.testing.assert_allclose(out.data, apply("relu_grad", z, product(a, b, ta, tb)).data, rtol=1e-12)


def test_fused_shape_errors_name_the_op():
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((3, 4)))
    with pytest.raises(ShapeError, match=r"linear: bias has shape \(3,\), expected \(4,\)"):
        apply("linear", a, b, Tensor(np.ones(3)), activation="relu")
    with pytest.raises(ShapeError, match=r"gemm: inner dimensions differ"):
        apply("gemm", a, a, Tensor(np.ones((2, 3))), 1.0, 1.0)
    with pytest.raises(ShapeError, match=r"gemm: alpha has shape \(1,\), expected a scalar"):
        apply("gemm", a, b, Tensor(np.ones((2, 4))), Tensor(np.ones(1)), 1.0)
