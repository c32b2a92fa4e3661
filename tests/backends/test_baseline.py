"""The baseline compiler (``backends.baseline``): float32 steps straight to LLVM IR, compiled by
LLVM's JIT at -O0, checked against the reference backend (float32 rtol 2e-4 / atol 2e-5, as in
test_cpu.py; parameters after several steps atol 2e-5) at awkward batch sizes and widths."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn.backends import baseline
from mlir_nn.backends.cpu import CpuExecutable
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.llvm_jit import Jit
from mlir_nn.backends.reference import ReferenceExecutable
from mlir_nn.ir import Graph, make_node
from mlir_nn.jit.trace import trace_step
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP, Linear, ReLU, Sequential, Sigmoid, Tanh
from mlir_nn.optim import SGD, Adagrad, Adam, AdamW, RMSprop
from mlir_nn.trainer import train_step
from tests.codegen.zoo import arguments, elementwise_zoo, matmul_zoo

TOL = dict(rtol=2e-4, atol=2e-5)
BATCHES = (1, 7, 33, 257, 7)


def _agree(graph: Graph, inputs_for, params: list[np.ndarray], steps=BATCHES) -> None:
    """The baseline's executable and the reference, each on its own copy of ``params``, agree on
    every output and on the parameters after each call."""
    kernel = baseline.compile_step(graph)
    assert kernel is not None, "the baseline compiler declined the step"
    compiled, reference = CpuExecutable(graph, kernel), ReferenceExecutable(graph)
    ours, theirs = [p.copy() for p in params], [p.copy() for p in params]
    for batch in steps:
        inputs = inputs_for(batch)
        got, want = compiled.run([x.copy() for x in inputs], ours), reference.run(inputs, theirs)
        for a, b in zip(got + ours, want + theirs, strict=True):
            np.testing.assert_allclose(a, b, **TOL)


def _traced(model, optimizer, features: int, outputs: int):
    rng = np.random.default_rng(1)

    def batch(n: int) -> list[np.ndarray]:
        return [rng.standard_normal((n, features)).astype(np.float32),
                rng.standard_normal((n, outputs)).astype(np.float32)]

    graph, captured, _ = trace_step(train_step(model, optimizer, mse_loss), batch(9), ["x", "y"])
    return graph, batch, [t.data for t in captured]


OPTIMIZERS = {
    "sgd": lambda ps: SGD(ps, lr=0.05),
    "sgd-momentum": lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda ps: Adam(ps, lr=0.01),
    "adamw": lambda ps: AdamW(ps, lr=0.01),
    "rmsprop": lambda ps: RMSprop(ps, lr=0.01),
    "adagrad": lambda ps: Adagrad(ps, lr=0.05),
}


@pytest.mark.parametrize("sizes", [[5, 7, 3], [1, 1, 1], [3, 1, 4, 2], [16, 64, 64, 10]])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_mlp_training_steps_agree_with_the_reference(optimizer, sizes):
    np.random.seed(0)
    model = MLP(sizes[0], sizes[1:])
    graph, batch, params = _traced(model, OPTIMIZERS[optimizer](model.parameters()), sizes[0], sizes[-1])
    _agree(graph, batch, params)


def test_tanh_and_sigmoid_layers_agree_with_the_reference():
    np.random.seed(2)
    model = Sequential(Linear(4, 6), Tanh(), Linear(6, 5), Sigmoid(), Linear(5, 2), ReLU())
    graph, batch, params = _traced(model, Adam(model.parameters(), lr=0.01), 4, 2)
    _agree(graph, batch, params)


def _within(graph: Graph) -> Graph:
    """``graph`` with only the outputs whose every op the baseline compiler takes."""
    def taken(node) -> bool:
        return baseline.emit_step(Graph(graph.inputs, graph.params, (node,), name="probe")) is not None

    kept = tuple(n for n in graph.outputs if taken(n))
    return Graph(graph.inputs, graph.params, kept, graph.updates, name=graph.name)


@pytest.mark.parametrize("width", [1, 3, 17])
def test_the_element_wise_zoo_agrees_with_the_reference(width):
    """Broadcasts (a row, a scalar), every element-wise op it takes, sums to rows and to
    (1, width), mse and its gradient, a transpose: each output of the zoo it takes."""
    graph = _within(elementwise_zoo(width, "float32"))
    assert {n.op for n in graph.outputs} >= {"add", "sub", "div", "pow", "tanh", "sigmoid", "sum_to", "mse",
                                             "mse_grad", "transpose", "broadcast_to", "relu_grad"}
    rng = np.random.default_rng(width)
    _, params = arguments(graph, 1, rng)
    _agree(graph, lambda n: arguments(graph, n, rng)[0], params)


@pytest.mark.parametrize("k, m", [(1, 1), (5, 3), (33, 17)])
def test_products_in_every_transpose_combination_agree_with_the_reference(k, m):
    graph = _within(matmul_zoo(k, m, "float32"))
    assert sum(n.op == "matmul" for n in graph.outputs) >= 4
    rng = np.random.default_rng(k)
    _, params = arguments(graph, 1, rng)
    _agree(graph, lambda n: arguments(graph, n, rng)[0], params)


def _leaf(kind: str, name: str, shape: tuple) -> object:
    return make_node(kind, [], name=name, shape=shape, dtype="float32")


def test_an_update_read_after_it_is_computed_is_written_at_the_end():
    """Every node reads the parameters' old values: a parameter that a later value reads is
    updated after the step (not in place), and one returned as it is keeps its old value."""
    x, p, q = _leaf("input", "x", ("N", 4)), _leaf("param", "p", (4,)), _leaf("param", "q", (4,))
    two = make_node("const", [], value=2.0, dtype="float32")
    doubled = make_node("mul", [p, two])  # p's update, which the output needs first
    late = make_node("add", [make_node("mul", [x, doubled]), p])  # reads the old p after it
    in_place = make_node("sub", [q, make_node("sum_to", [x], shape=(4,))])  # q: nothing reads it later
    graph = Graph((x,), (p, q), (late, p, q), (("p", doubled), ("q", in_place)), name="updates")
    rng = np.random.default_rng(4)
    params = [rng.standard_normal(4).astype(np.float32) for _ in range(2)]
    _agree(graph, lambda n: [rng.standard_normal((n, 4)).astype(np.float32)], params)
    homes, copied, _ = baseline._Emitter(graph, "probe").plan()
    assert set(copied) == {"p"} and homes[in_place] == ("param", 1)


def test_steps_it_does_not_take_are_left_to_mlir(monkeypatch):
    x = _leaf("input", "x", ("N", 3))
    assert baseline.emit_step(Graph((x,), (), (make_node("softmax", [x], axis=1),))) is None  # an op
    wide = make_node("input", [], name="x", shape=("N", 3), dtype="float64")
    assert baseline.emit_step(Graph((wide,), (), (make_node("neg", [wide]),))) is None  # a dtype
    square = _leaf("input", "s", ("N", "N"))
    assert baseline.emit_step(Graph((square,), (), (make_node("neg", [square]),))) is None  # the batch twice
    taken = Graph((x,), (), (make_node("neg", [x]),))
    assert baseline.compile_step(taken) is not None
    monkeypatch.setenv(baseline.SWITCH, "0")
    assert baseline.compile_step(taken) is None


def test_its_ir_is_the_llvm_ir_stage():
    x = _leaf("input", "x", ("N", 3))
    kernel = baseline.compile_step(Graph((x,), (), (make_node("relu", [x]),), name="shown"))
    text = kernel.stages["llvm-ir"]
    assert kernel.opt_level == 0 and "define void @mlirnn_baseline_shown(ptr %args)" in text
    assert f"load <{baseline.LANES} x float>" in text and "load float" in text  # LANES at a time, then the rest


def test_invalid_ir_text_is_a_native_error_with_llvms_message():
    with pytest.raises(NativeError, match="invalid LLVM IR: .*expected"):
        Jit("define void @f( {", "broken")


FRESH = """
import json, sys
import numpy as np
from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.losses import mse_loss
from mlir_nn.trainer import train_step
model = MLP(4, [8, 2])
step = jit(train_step(model, Adam(model.parameters(), lr=0.01), mse_loss))
step(np.ones((5, 4), np.float32), np.ones((5, 2), np.float32))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("mlir", "egglog"))
print(json.dumps({"tier": step._last.tier, "stages": sorted(step._last.executable.kernel.stages), "loaded": loaded}))
step._last._background.cancel()
"""


def test_a_fresh_native_first_call_loads_neither_mlir_nor_egglog(tmp_path):
    env = {"MLIR_NN_CACHE_DIR": str(tmp_path), "MLIR_NN_TIERED": "1", "MLIR_NN_FIRST_TIER": "native"}
    import os

    done = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"tier": "quick", "stages": ["llvm-ir"], "loaded": []}
