"""SGD updates of a product recognized as W + c * product (``parameter_updates``)."""

from __future__ import annotations

import pytest

from mlir_nn.codegen import emit_linalg
from mlir_nn.codegen.parameter_updates import parameter_update
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.ir import Graph, make_node


def _product_of(graph: Graph):
    module = emit_linalg(graph)
    products = collect_ops(module, lambda op: op.name == "linalg.matmul")
    assert len(products) == 1
    return module, products[0]


def _sgd_graph(beta: float | str, subtract: bool = True) -> Graph:
    x = make_node("input", [], name="x", shape=("N", 40), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", 64), dtype="float32")
    w = make_node("param", [], name="w", shape=(40, 64), dtype="float32")
    lr = make_node("param", [], name="lr", shape=(), dtype="float32")
    one = make_node("const", [], value=1.0, dtype="float32")
    scale = one if beta == 1.0 else make_node("sub", [one, lr])
    update = make_node("gemm", [x, g, w, lr, scale], transpose_a=True, subtract=subtract)
    return Graph((x, g), (w, lr), (), updates=(("w", update),), name="sgd")


@pytest.mark.parametrize("subtract", [True, False])
def test_an_sgd_update_is_the_parameter_plus_a_factor_times_the_product(subtract):
    """W - lr * x^T g (and W + lr * x^T g): the parameter W (the step's argument), the factor lr
    (a 0-d argument), negated where the update subtracts."""
    module, product = _product_of(_sgd_graph(1.0, subtract))
    with module.context:
        update = parameter_update(product.result)
        assert update is not None and update.negate == subtract
        step = module.body.operations[0]
        arguments = list(step.regions[0].blocks[0].arguments)
        assert update.parameter in arguments and update.factor in arguments
        assert update.parameter != update.factor


def test_a_decayed_parameter_is_no_plain_update():
    """(1 - lr) * W - lr * x^T g scales W too: not recognized (the product could not start from W)."""
    module, product = _product_of(_sgd_graph("decay"))
    with module.context:
        assert parameter_update(product.result) is None


def test_a_product_read_by_other_ops_is_no_update():
    """relu(x^T g): the product's reader is no update of a parameter."""
    x = make_node("input", [], name="x", shape=("N", 40), dtype="float32")
    g = make_node("input", [], name="g", shape=("N", 64), dtype="float32")
    graph = Graph((x, g), (), (make_node("relu", [make_node("matmul", [x, g], transpose_a=True)]),), name="relu")
    module, product = _product_of(graph)
    with module.context:
        assert parameter_update(product.result) is None
