"""float32 exp and erf expanded inline on the CPU (``codegen.inline_math``): within 2 ulp of the
correctly rounded value at every exponent and both signs, the limits of the float32 range
exact (0, +inf, +-1), NaN kept, float64 left to libm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlir_nn.backends.cpu import CpuBackend
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.inline_math import inline_f32_math
from mlir_nn.ir import Graph, make_node

TINY = np.finfo(np.float32).tiny  # compiled steps flush subnormal results to zero


def _graph(rows: int, dtype: str) -> Graph:
    x = make_node("input", [], name="x", shape=(rows,), dtype=dtype)
    return Graph((x,), (), (make_node("exp", [x]), make_node("erf", [x])), name="exp_erf")


def _arguments() -> np.ndarray:
    parts = [np.linspace(-110.0, 95.0, 40001, dtype=np.float32)]
    for e in range(-40, 7):  # every binade from 2^-40 to 128, both signs
        m = np.linspace(1.0, 2.0, 513, dtype=np.float32) * np.float32(2.0**e)
        parts += [m, -m]
    edges = [0.0, -0.0, 0.921875, np.nextafter(np.float32(0.921875), 0), 7.8125, -7.8125, 88.72, 88.73,
             -87.33, -103.9, -104.0, -1e4, 1e4]
    return np.concatenate(parts + [np.array(edges, np.float32)])


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


def test_float32_exp_and_erf_are_within_two_ulp_everywhere():
    x = _arguments()
    got_exp, got_erf = CpuBackend().compile(_graph(len(x), "float32")).run([x], [])
    exact = torch.from_numpy(x.astype(np.float64))
    with np.errstate(over="ignore"):
        want_exp = torch.exp(exact).numpy().astype(np.float32)
    want_erf = torch.erf(exact).numpy().astype(np.float32)
    normal = np.isfinite(want_exp) & (want_exp >= TINY)
    assert _ulps(got_exp[normal], want_exp[normal]).max() <= 2
    np.testing.assert_array_equal(got_exp[want_exp < TINY / 2], 0.0)
    np.testing.assert_array_equal(got_exp[np.isinf(want_exp)], np.inf)
    assert _ulps(got_erf[want_erf != 0], want_erf[want_erf != 0]).max() <= 2
    np.testing.assert_array_equal(got_erf[np.abs(x) >= 7.8125], np.sign(x[np.abs(x) >= 7.8125]))


def test_infinities_and_nan_inside_a_step():
    """exp(-inf) (a masked attention score) is 0, exp(inf) inf, erf(+-inf) +-1; NaN stays NaN."""
    x = make_node("input", [], name="x", shape=(3,), dtype="float32")
    logs, exps = make_node("log", [x]), make_node("exp", [x])  # x = (0, 100, -1): (-inf, 4.6, NaN), (1, inf, e^-1)
    graph = Graph((x,), (), tuple(make_node(op, [v]) for v in (logs, exps) for op in ("exp", "erf")), name="special")
    exp_log, erf_log, exp_exp, erf_exp = CpuBackend().compile(graph).run([np.array([0.0, 100.0, -1.0], np.float32)], [])
    assert exp_log[0] == 0.0 and erf_log[0] == -1.0 and np.isnan(exp_log[2]) and np.isnan(erf_log[2])
    assert exp_exp[1] == np.inf and erf_exp[1] == 1.0
    np.testing.assert_allclose(exp_log[1], 100.0, rtol=1e-6)
    np.testing.assert_allclose(exp_exp[[0, 2]], np.exp([1.0, np.exp(-1.0)]), rtol=1e-6)


@pytest.mark.parametrize("dtype, expanded", [("float32", 2), ("float64", 0)])
def test_only_float32_ops_are_expanded(dtype, expanded):
    module = emit_linalg(_graph(5, dtype))
    assert inline_f32_math(module) == expanded
    text = str(module)
    assert ("math.exp" in text) == (dtype == "float64") and ("math.erf" in text) == (dtype == "float64")
