"""Cheap element-wise maps copied into each element-wise user (codegen/recompute.py): after
elementwise fusion nothing stores them; the results stay the reference's."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends.lowering import run_pipeline
from mlir_nn.codegen.recompute import recompute_cheap_maps
from mlir_nn.support.pipelines import Pipeline

# y = MAP(x), read by two element-wise users and returned
_MODULE = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @f(%x: tensor<7x5xf32>, %z: tensor<7x5xf32>, %r: tensor<5xf32>)
    -> (tensor<7x5xf32>, tensor<7x5xf32>, RETURNED) {
  %c = arith.constant 0.5 : f32
  %e = tensor.empty() : tensor<7x5xf32>
  %y = linalg.generic {indexing_maps = [MAP_IN, #id], iterator_types = ["parallel", "parallel"]}
      ins(INPUT) outs(%e : tensor<7x5xf32>) {
  ^bb0(%a: f32, %o: f32):
    BODY
  } -> tensor<7x5xf32>
  %u = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%y, %z : tensor<7x5xf32>, tensor<7x5xf32>) outs(%e : tensor<7x5xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<7x5xf32>
  %v = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%y, %z : tensor<7x5xf32>, tensor<7x5xf32>) outs(%e : tensor<7x5xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.mulf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<7x5xf32>
  return %u, %v, RESULT : tensor<7x5xf32>, tensor<7x5xf32>, RETURNED
}
"""
_SCALE = "%m = arith.mulf %a, %c : f32\n    linalg.yield %m : f32"


def _module(body=_SCALE, map_in="#id", returned=False):
    text = _MODULE.replace("BODY", body).replace("MAP_IN", map_in)
    text = text.replace("INPUT", "%r : tensor<5xf32>" if map_in == "#row" else "%x : tensor<7x5xf32>")
    return text.replace("RETURNED", "tensor<7x5xf32>" if returned else "tensor<5xf32>").replace(
        "RESULT", "%y" if returned else "%r")


def _copies_and_stored(text: str) -> tuple[int, int]:
    """Copies made, and results of the generics left after elementwise fusion."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        copies = recompute_cheap_maps(module)
        assert module.operation.verify()
        run_pipeline(module, Pipeline("fuse", ("linalg-fuse-elementwise-ops", "canonicalize", "cse")))
        stored = sum(len(op.results) for op in module.body.operations[0].regions[0].blocks[0].operations
                     if op.name == "linalg.generic")
        return copies, stored


@pytest.mark.parametrize("body", [_SCALE, "%m = arith.negf %a : f32\n    linalg.yield %m : f32",
                                  "%m = arith.subf %c, %a : f32\n    linalg.yield %m : f32"])
def test_a_cheap_map_is_recomputed_by_each_user_and_never_stored(body):
    assert _copies_and_stored(_module(body)) == (1, 2)  # the two users' results only


def test_a_returned_map_is_stored_once_and_recomputed_by_the_users():
    assert _copies_and_stored(_module(returned=True)) == (2, 3)  # y for the return; u and v


@pytest.mark.parametrize("body, map_in", [
    ("%m = math.exp %a : f32\n    linalg.yield %m : f32", "#id"),  # not cheap
    ("%m = arith.mulf %a, %c : f32\n    %n = arith.addf %m, %c : f32\n    linalg.yield %n : f32", "#id"),  # two ops
    (_SCALE, "#row"),  # a broadcast: the users would read the small input once per row
])
def test_other_maps_stay_stored(body, map_in):
    copies, stored = _copies_and_stored(_module(body, map_in))
    assert copies == 0 and stored == 3  # fused into the first user as a second result, read by the other


def _gelu_graph(dtype: str, rows: int):
    """The optimized graph of a step: GELU of x @ w, the sum's gradient to w (input-grad and
    weight-grad products around GELU's forward and backward passes)."""
    import mlir_nn
    from mlir_nn.engine import Tensor
    from mlir_nn.nn import functional as F

    w = Tensor(np.linspace(-2.0, 2.0, 5 * 33, dtype=dtype).reshape(5, 33))

    def step(x):
        y = F.gelu(x @ w)
        (y * y).sum().backward()
        result = [y, w._grad]
        w.grad = None
        return result

    return mlir_nn.jit(step, backend="numpy").lower(np.ones((rows, 5), dtype)).optimized_graph, w.data


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rows", [1, 13])
def test_gelu_step_matches_the_reference(dtype, rows):
    """GELU's forward keeps x / sqrt 2 and x / 2 in registers; its backward recomputes them."""
    from mlir_nn.backends import get_backend
    from mlir_nn.backends.reference import evaluate

    graph, w = _gelu_graph(dtype, rows)
    assert "erf" in {n.op for n in graph.nodes} and len(graph.params) == 1
    inputs = [(3 * np.random.default_rng(rows).standard_normal((rows, 5))).astype(dtype)]
    want, _ = evaluate(graph, inputs, [w.copy()], rows)
    got = get_backend("cpu").compile(graph).run(inputs, [w.copy()])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w, **tol)
