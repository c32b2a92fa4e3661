"""Element-wise update chains fused into one pass over buffers (codegen/fuse_updates.py)."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends.cpu import CpuBackend, lower
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen.fuse_updates import fuse_elementwise_chains
from mlir_nn.egraph.cache import optimize_cached
from mlir_nn.support.pipelines import Pipeline, load_pipeline
from tests.egraph.util import random_arguments, trace_mlp

# m <- 0.9 m + g; then BETWEEN; then p <- p - m (an update chain as bufferization leaves it)
_CHAIN = """
#id = affine_map<(d0) -> (d0)>
func.func @chain(%p: memref<7xf32>, %m: memref<7xf32>, %g: memref<7xf32>, %other: memref<7xf32>) {
  %c = arith.constant 0.9 : f32
  linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%m, %g : memref<7xf32>, memref<7xf32>) outs(%m : memref<7xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %x = arith.mulf %a, %c : f32
    %y = arith.addf %x, %b : f32
    linalg.yield %y : f32
  }
  BETWEEN
  linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%p, %m : memref<7xf32>, memref<7xf32>) outs(%p : memref<7xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %y = arith.subf %a, %b : f32
    linalg.yield %y : f32
  }
  return
}
"""


def _run_chain(between: str) -> tuple[int, int]:
    """Fuse the chain with ``between`` in the middle: (count fused, generics left)."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(_CHAIN.replace("BETWEEN", between))
        count = fuse_elementwise_chains(module)
        assert module.operation.verify()
        return count, str(module).count("linalg.generic")


@pytest.mark.parametrize(
    "between, fused",
    [
        ("", 1),
        ("memref.copy %g, %other : memref<7xf32> to memref<7xf32>", 1),  # reads what m's update reads: may pass
        ("memref.copy %m, %other : memref<7xf32> to memref<7xf32>", 0),  # reads the new m: the order matters
        ("memref.copy %other, %g : memref<7xf32> to memref<7xf32>", 0),  # writes what m's update reads
    ],
)
def test_a_chain_fuses_only_when_nothing_between_depends_on_its_order(between, fused):
    count, generics = _run_chain(between)
    assert count == fused and generics == 2 - fused


def _adam_graph(widths: list[int], dtype: str):
    graph, _, _ = trace_mlp(widths, 8, "--optimizer", "adam", dtype=dtype)
    return optimize_cached(graph, 8)[0]


def test_adam_writes_each_parameter_and_its_moments_in_one_pass_without_copies():
    graph = _adam_graph([13, 33, 7], "float32")
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("convert-linalg-to-loops"))
    module, _, _ = lower(graph, Pipeline("until-loops", shipped.passes[:cut]))
    lines = str(module).splitlines()
    for shape in ("13x33xf32", "33x7xf32"):
        three_outs = [
            line
            for line in lines
            if "linalg.generic" in line and line.split("outs(")[-1].count(f"memref<{shape}>") == 3
        ]
        assert len(three_outs) == 1, shape  # p, m and v written by one generic
        assert not [line for line in lines if "memref.copy" in line and f"memref<{shape}>" in line]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_adam_steps_match_the_reference_at_awkward_sizes(dtype):
    graph = _adam_graph([13, 33, 7], dtype)
    executable = CpuBackend().compile(graph)
    slot = {p.attr("name"): i for i, p in enumerate(graph.params)}
    tol = dict(rtol=2e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-11, atol=1e-13)
    for batch in (1, 7, 13, 33, 257, 4099):
        inputs, params = random_arguments(graph, batch, np.random.default_rng(batch))
        inputs = [a.astype(n.dtype) for a, n in zip(inputs, graph.inputs)]
        params = [np.asarray(a, dtype=n.dtype) for a, n in zip(params, graph.params)]
        want, updates = evaluate(graph, inputs, [p.copy() for p in params], batch)
        got = executable.run(inputs, params)
        for value, expected in zip(got, want):
            np.testing.assert_allclose(value, expected, **tol, err_msg=f"output, batch {batch}")
        for (name, _), expected in zip(graph.updates, updates):
            np.testing.assert_allclose(params[slot[name]], expected, **tol, err_msg=f"{name}, batch {batch}")


def test_adam_bias_corrections_are_computed_once_not_per_element():
    """exp(t * log(beta)) reads only scalars: after the hoist no exp or log is left in a body
    that loops over a parameter (there were two exps per element)."""
    graph = _adam_graph([13, 33, 7], "float32")
    shipped = load_pipeline("cpu")
    cut = next(i for i, p in enumerate(shipped.passes) if p.startswith("inline"))
    module, _, _ = lower(graph, Pipeline("until-inline", shipped.passes[:cut]))
    chunks = [c.split("linalg.yield")[0] for c in str(module).split("linalg.generic")[1:]]  # header and body
    updates = [c for c in chunks if c.split("{\n")[0].split("outs(")[-1].count("memref<13x33xf32>") == 3]
    assert len(updates) == 1
    assert "math.exp" not in updates[0] and "math.log" not in updates[0]
    assert "math.sqrt" in updates[0]  # per element work stays
