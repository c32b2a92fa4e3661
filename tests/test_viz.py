"""Graph drawings as DOT text."""

import shutil

import numpy as np
import pytest

from mlir_nn.engine import Value
from mlir_nn.jit import trace_step
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step
from mlir_nn.viz import draw_graph


def test_tensor_graph_shows_labels_values_grads_and_ops():
    a, b, c = Value(2.0, label="a"), Value(-3.0, label="b"), Value(10.0, label="c")
    f = (a * b + c).relu()
    f.backward()
    dot = draw_graph(f)
    assert dot.startswith("digraph mlir_nn {")
    assert '"{ a | data 2.0000 | grad -3.0000 }"' in dot
    assert 'label="relu"' in dot and 'label="mul"' in dot and 'label="add"' in dot


def test_traced_graph_marks_backward_and_updates():
    model = MLP(2, [3, 1])
    opt = SGD(model.parameters())

    step = train_step(model, opt)

    graph = trace_step(step, [np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)], ["x", "y"])[0]
    dot = draw_graph(graph)
    assert "matmul | f32[N, 3]" in dot and "mse_grad | f32[N, 1]" in dot
    assert "fillcolor=lightpink" in dot and "fillcolor=lightblue" in dot
    assert dot.count('label="update"') == 4


def test_render_needs_graphviz(tmp_path):
    f = Value(1.0).relu()
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match="Graphviz"):
            draw_graph(f, str(tmp_path / "g.svg"))
    else:
        draw_graph(f, str(tmp_path / "g.svg"))
        assert (tmp_path / "g.svg").read_text().lstrip().startswith("<")
