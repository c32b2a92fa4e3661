"""The first stage of a compiled step: run the eager-style step function once on symbolic
inputs and collect every tensor operation, the backward pass and the parameter updates
into one Graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, Trace, numeric_array, set_trace
from mlir_nn.ir import BATCH, Graph, verify
from mlir_nn.ir.shapes import dtype_name


def to_input_array(value: Any, name: str, default_dtype: str = "float32") -> np.ndarray:
    """An argument as a C-contiguous float array in native byte order; integers, and Python
    numbers and lists (which numpy would make float64), take ``default_dtype``."""
    array = numeric_array(value, f"jit: argument {name}")
    if array.dtype.kind != "f" or not isinstance(value, (np.ndarray, np.generic, Tensor)):
        array = array.astype(default_dtype)
    dtype_name(array.dtype)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def batch_is_shared(arrays: list[np.ndarray]) -> bool:
    """True when every argument has a leading axis and all have the same length."""
    return bool(arrays) and all(a.ndim >= 1 for a in arrays) and len({a.shape[0] for a in arrays}) == 1


def trace_step(fn: Callable[..., Any], arrays: list[np.ndarray], names: list[str],
               dynamic_batch: bool = True) -> tuple[Graph, list[Tensor], bool]:
    """Trace ``fn`` on inputs shaped like ``arrays``; return (graph, captured, single output)."""
    dynamic = dynamic_batch and batch_is_shared(arrays)
    trace = Trace()
    symbolic = [
        trace.add_input(name, ((BATCH,) + a.shape[1:]) if dynamic else a.shape, a.dtype.name)
        for name, a in zip(names, arrays)
    ]
    set_trace(trace)
    try:
        result = fn(*symbolic)
        single = isinstance(result, Tensor)
        results = () if result is None else (result,) if single else tuple(result)
        for r in results:
            if not isinstance(r, Tensor):
                raise TypeError(f"jit: the step must return tensors, got {type(r).__name__}")
        outputs = tuple(trace.node_of(trace.resolve(r)) for r in results)
        updates = []
        for key, value in trace.updates.items():
            param = trace.param_node_of(key)
            new = trace.node_of(value)
            if new != param:
                updates.append((param.attr("name"), new))
    finally:
        set_trace(None)
        trace.close()
    full = Graph(tuple(trace.inputs), tuple(trace.param_nodes), outputs, tuple(updates), name=fn.__name__)
    used = set(full.nodes) | {full.param_by_name(n) for n, _ in updates}
    keep = [i for i, p in enumerate(trace.param_nodes) if p in used]
    graph = Graph(full.inputs, tuple(trace.param_nodes[i] for i in keep), outputs, tuple(updates), name=full.name)
    verify(graph)
    return graph, [trace.captured[i] for i in keep], single
