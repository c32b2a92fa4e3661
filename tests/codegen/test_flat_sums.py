"""Whole-tensor reductions become 1-D sums once fused, and still match the reference."""

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends import get_backend
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.flat_sums import flatten_whole_reductions
from mlir_nn.codegen.walk import collect_linalg_ops
from mlir_nn.ir import Graph, make_node

ROWS = [1, 7, 13, 33, 257, 4099]


def mse_graph(width: int, dtype: str) -> Graph:
    p = make_node("input", [], name="p", shape=("N", width), dtype=dtype)
    y = make_node("input", [], name="y", shape=("N", width), dtype=dtype)
    return Graph((p, y), (), (make_node("mse", [p, y]),), name="mse")


def sums_graph(dtype: str) -> Graph:
    """A whole sum of a 3-D tensor, and one over rows only (not whole: left as it is)."""
    x = make_node("input", [], name="x", shape=("N", 3, 5), dtype=dtype)
    whole = make_node("sum", [x], axes=(0, 1, 2), keepdims=False)
    rows = make_node("sum", [x], axes=(0,), keepdims=False)
    return Graph((x,), (), (whole, rows), name="sums")


def generic_ranks(module: ir.Module) -> list[tuple[int, tuple[str, ...]]]:
    """(loop count, iterator kinds) of each generic with a 0-d result."""
    found = []
    for op in collect_linalg_ops(module, lambda op: op.name == "linalg.generic"):
        if op.results and ir.RankedTensorType(op.results[0].type).rank == 0:
            kinds = tuple(str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"]))
            found.append((len(kinds), kinds))
    return found


@pytest.mark.parametrize("graph", [mse_graph(10, "float32"), sums_graph("float32")], ids=["mse", "sums"])
def test_whole_reductions_are_rewritten_as_one_loop_and_others_are_not(graph):
    module = emit_linalg(graph, wide_sums=True)
    with module.context:
        assert any(rank > 1 for rank, _ in generic_ranks(module))
        assert flatten_whole_reductions(module) == 1
        module.operation.verify()
        assert all(rank <= 1 for rank, _ in generic_ranks(module))
        rows = [op for op in collect_linalg_ops(module, lambda op: op.name == "linalg.generic")
                if op.results and ir.RankedTensorType(op.results[0].type).rank == 2
                and len(ir.ArrayAttr(op.attributes["iterator_types"])) == 3]
    assert graph.name != "sums" or rows  # the sum over rows keeps its three loops


def float64_truth(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    wide = [x.astype(np.float64) for x in inputs]
    if graph.name == "mse":
        return [np.mean((wide[0] - wide[1]) ** 2)]
    return [wide[0].sum(), wide[0].sum(axis=0)]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("graph", [mse_graph(10, "float32"), mse_graph(3, "float64"), sums_graph("float32")],
                         ids=["mse-f32", "mse-f64", "sums"])
def test_flattened_sums_match_the_reference(graph, rows):
    """Against the reference's shapes and dtypes, and the float64 sums (the reference sums float32
    in float32: 1e-5 off over 4099 rows, the compiled step accumulates in float64)."""
    rng = np.random.default_rng(rows)
    inputs = [rng.standard_normal((rows, *n.shape[1:])).astype(n.dtype) for n in graph.inputs]
    want, _ = evaluate(graph, inputs, [], rows)
    got = get_backend("cpu").compile(graph).run(inputs, [])
    tol = dict(rtol=1e-6, atol=1e-6) if graph.inputs[0].dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    for g, w, truth in zip(got, want, float64_truth(graph, inputs)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, truth, **tol)


def test_the_cpu_lowering_sums_a_loss_in_one_loop():
    """The cpu backend's pipeline rewrites the fused MSE sum (which the fusion pass had made a
    loop nest again) before bufferization: its reduction reaches the buffers as one loop."""
    from mlir_nn.backends.cpu import lower_with_plan
    from mlir_nn.support.pipelines import Pipeline, load_pipeline

    passes = load_pipeline("cpu").passes
    bufferized = next(i for i, p in enumerate(passes) if p.startswith("one-shot-bufferize")) + 1
    head = Pipeline("cpu-head", passes[:bufferized])
    module, *_ = lower_with_plan(mse_graph(10, "float32"), head, threads=False, llvm_text=False)
    with module.context:
        reductions = [op for op in collect_linalg_ops(module, lambda op: op.name == "linalg.generic")
                      if any("reduction" in str(k) for k in ir.ArrayAttr(op.attributes["iterator_types"]))]
        assert [len(ir.ArrayAttr(op.attributes["iterator_types"])) for op in reductions] == [1]
