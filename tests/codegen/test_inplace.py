"""Updates written into the parameters: the private step, no call for bufferization to analyse,
published again once its update results are dropped (``codegen.inplace``)."""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

from mlir_nn import jit
from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.inplace import IMPL_SUFFIX, publish_step, write_updates_in_place
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import train_step

ROWS = [1, 7, 13, 33, 257, 4099]


def _scaled_graph() -> Graph:
    """out = sum(x * w); w <- w * 0.5 (the output reads the old w)."""
    x = make_node("input", [], name="x", shape=("N", 3), dtype="float32")
    w = make_node("param", [], name="w", shape=(3,), dtype="float32")
    half = make_node("const", [], value=0.5, dtype="float32")
    out = make_node("sum", [make_node("mul", [x, w])], axes=(0, 1), keepdims=False)
    return Graph((x,), (w,), (out,), updates=(("w", make_node("mul", [w, half])),), name="scaled")


def _functions(module: ir.Module) -> list[tuple[str, str | None, bool]]:
    """(name, visibility, C interface) of each function of ``module``."""
    found = []
    for op in module.body.operations:
        if op.operation.name == "func.func":
            attributes = op.attributes
            visibility = ir.StringAttr(attributes["sym_visibility"]).value if "sym_visibility" in attributes else None
            found.append((ir.StringAttr(attributes["sym_name"]).value, visibility,
                          "llvm.emit_c_interface" in attributes))
    return found


def test_the_step_is_one_private_function_that_nothing_calls_until_published():
    """Bufferization sees one function and no call (MLIR's analysis of a call with hundreds of
    operands is quadratic in them); ``publish_step`` makes it the public step again."""
    module = emit_linalg(_scaled_graph())
    with module.context:
        write_updates_in_place(module, module.body.operations[0], 1, [1])
        assert _functions(module) == [("scaled" + IMPL_SUFFIX, "private", False)]
        assert not collect_ops(module, lambda op: op.name == "func.call")
        step = module.body.operations[0]
        results = ir.FunctionType(ir.TypeAttr(step.attributes["function_type"]).value).results
        assert len(results) == 2  # the output, then the update written into w
        module.operation.verify()
        publish_step(module, "scaled")
        assert _functions(module) == [("scaled", None, True)]
        with pytest.raises(ValueError, match="no function"):
            publish_step(module, "scaled")


@pytest.mark.parametrize("rows", ROWS)
def test_an_adam_step_updates_every_parameter_in_place_like_the_reference(rows):
    """Three steps of a 3-layer Adam MLP on the cpu backend against the reference backend: loss,
    and every parameter after each step (written in place into the parameters' own arrays)."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 5)).astype(np.float32)
    y = rng.standard_normal((rows, 2)).astype(np.float32)
    start = [rng.standard_normal(p.data.shape).astype(np.float32) for p in MLP(5, [7, 4, 2]).parameters()]
    runs = {}
    for backend in ("numpy", "cpu"):
        model = MLP(5, [7, 4, 2])
        for p, value in zip(model.parameters(), start, strict=True):
            p.data[...] = value
        arrays = [p.data for p in model.parameters()]
        step = jit(train_step(model, Adam(model.parameters(), lr=1e-2)), backend=backend)
        history = []
        for _ in range(3):
            loss = step(x, y)
            history.append((float(loss), [p.data.copy() for p in model.parameters()]))
        assert all(p.data is a for p, a in zip(model.parameters(), arrays))  # updated in their own arrays
        runs[backend] = history
    for (want_loss, want), (got_loss, got) in zip(runs["numpy"], runs["cpu"]):
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-4)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dropped", [("inline{default-pipeline=}",),
                                     ("drop-equivalent-buffer-results", "inline{default-pipeline=}")])
def test_a_pipeline_that_does_not_drop_and_inline_calls_the_step_through_a_public_wrapper(dropped):
    """A user's pipeline without those passes still compiles a step that updates in place (it
    failed with "no function with a C interface" while the step stayed private)."""
    from mlir_nn.backends.cpu import CpuBackend
    from mlir_nn.backends.reference import evaluate
    from mlir_nn.support.pipelines import Pipeline, load_pipeline

    default = load_pipeline("cpu")
    mine = Pipeline("mine", tuple(p for p in default.passes if p not in dropped))
    assert len(mine.passes) == len(default.passes) - len(dropped)
    module = emit_linalg(_scaled_graph())
    with module.context:
        write_updates_in_place(module, module.body.operations[0], 1, [1], wrapper=True)
        assert _functions(module) == [("scaled" + IMPL_SUFFIX, "private", False), ("scaled", None, True)]
    graph = _scaled_graph()
    executable = CpuBackend(pipeline=mine).compile(graph)
    x, w = np.arange(21, dtype=np.float32).reshape(7, 3), np.array([1.0, -2.0, 0.5], np.float32)
    want, updates = evaluate(graph, [x], [w.copy()], 7)
    (got,) = executable.run([x], [w])
    np.testing.assert_allclose(got, want[0], rtol=1e-5)
    np.testing.assert_allclose(w, updates[0], rtol=1e-6)  # written into the parameter's own array
