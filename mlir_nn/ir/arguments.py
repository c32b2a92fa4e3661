"""Arrays checked against a graph's signature before anything runs them.

Every backend and the artifact runner check their arguments here, in Python, so bad input
never reaches native code and a failed step never writes a parameter.
"""

from __future__ import annotations

import numpy as np

from mlir_nn.ir.graph import Graph
from mlir_nn.ir.ops import check_labels
from mlir_nn.ir.printer import type_text
from mlir_nn.ir.shapes import BATCH, DTypeError, ShapeError, fmt_shape


def non_finite_error(graph: Graph, index: int, array: np.ndarray) -> ValueError:
    """The error for input ``index`` of ``graph`` holding NaN or infinite values."""
    bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
    return ValueError(f"{graph.name}: input {graph.inputs[index].attr('name')} contains {bad} NaN or infinite value(s)")


def label_inputs(graph: Graph) -> dict[int, int]:
    """{input position: classes} for the inputs that ``one_hot`` reads as class labels."""
    labels: dict[int, int] = {}
    for node in graph.nodes:
        if node.op == "one_hot" and node.inputs[0] in graph.inputs:
            position = graph.inputs.index(node.inputs[0])
            labels[position] = min(labels.get(position, node.attr("classes")), node.attr("classes"))
    return labels


def input_error(graph: Graph, index: int, array: np.ndarray) -> ValueError:
    """The error for input ``index`` that a compiled step's input check refused: NaN or
    infinity, else labels ``one_hot`` cannot take (the reference backend's message)."""
    classes = label_inputs(graph).get(index)
    if classes is None or not np.all(np.isfinite(array)):
        return non_finite_error(graph, index, array)
    try:
        check_labels(array, classes)
    except ValueError as e:
        return e
    return ValueError(f"{graph.name}: input {graph.inputs[index].attr('name')} was refused by the step's check")


def check_arguments(graph: Graph, inputs: list[np.ndarray], params: list[np.ndarray],
                    check_values: bool = True, labels: dict[int, int] | None = None) -> int | None:
    """Validate shapes, dtypes and (unless the backend's code does) input values; return the
    bound batch size (or None). With ``check_values``, the inputs at the positions of
    ``labels`` ({position: classes}; by default the graph's ``one_hot`` inputs) must be
    class labels."""
    if len(inputs) != len(graph.inputs):
        raise TypeError(f"{graph.name}: expected {len(graph.inputs)} inputs, got {len(inputs)}")
    if len(params) != len(graph.params):
        raise TypeError(f"{graph.name}: expected {len(graph.params)} parameters, got {len(params)}")
    batch: int | None = None
    for kind, nodes, arrays in (("input", graph.inputs, inputs), ("parameter", graph.params, params)):
        for node, array in zip(nodes, arrays):
            name = node.attr("name")
            if not isinstance(array, np.ndarray):
                raise TypeError(f"{graph.name}: {kind} {name} must be a numpy array, got {type(array).__name__}")
            if array.dtype != node.dtype:  # byte order included: compiled code reads native numbers
                order = "" if array.dtype.isnative else " in non-native byte order"
                raise DTypeError(
                    f"{graph.name}: {kind} {name} has dtype {array.dtype.name}{order}, expected {node.dtype}"
                )
            if array.ndim != len(node.shape):
                raise ShapeError(
                    f"{graph.name}: {kind} {name} has shape {fmt_shape(array.shape)}, expected {type_text(node)}"
                )
            for want, got in zip(node.shape, array.shape):
                if want == BATCH:
                    if batch is None:
                        batch = got
                    elif got != batch:
                        raise ShapeError(
                            f"{graph.name}: {kind} {name} has batch size {got} but an earlier input has {batch}"
                        )
                elif want != got:
                    raise ShapeError(
                        f"{graph.name}: {kind} {name} has shape {fmt_shape(array.shape)}, expected {type_text(node)}"
                    )
            if kind == "input" and check_values and not np.all(np.isfinite(array)):
                raise non_finite_error(graph, graph.inputs.index(node), array)
            if kind == "parameter" and not array.flags.writeable:
                raise ValueError(f"{graph.name}: parameter {name} is read-only; it must be writable")
    if batch is not None and batch < 1:
        raise ShapeError(f"{graph.name}: the batch is empty (batch size 0)")
    if check_values:
        for position, classes in (label_inputs(graph) if labels is None else labels).items():
            check_labels(inputs[position], classes)
    return batch
