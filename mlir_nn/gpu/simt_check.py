"""Check a compiled CUDA step on the SIMT interpreter against the NumPy reference.

``check_graph`` compiles a Graph for CUDA (no PTX needed), runs its launch plan on
``mlir_nn.gpu.simt`` with random inputs and parameters, and compares every output and
updated parameter with ``mlir_nn.backends.reference``. ``mlir-nn compile ... --target
cuda --simt-check`` prints its ``line``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlir_nn.backends.reference import evaluate
from mlir_nn.gpu.simt import Report, SimtProgram
from mlir_nn.ir import Graph, Node

TOLERANCE = {"float32": 1e-4, "float64": 1e-10}  # max error relative to the result's scale (at least 1)
MASKED = 0.25  # chance that a random mask element is true


@dataclass
class SimtCheck:
    report: Report
    max_rel_err: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.report.clean and self.max_rel_err <= self.tolerance

    @property
    def line(self) -> str:
        r = self.report
        return f"simt: {r.kernels} kernels, {len(r.races)} races, max rel err {self.max_rel_err:.2e}"

    @property
    def problems(self) -> list[str]:
        r = self.report
        out = r.races + r.out_of_bounds + r.divergent_barriers
        if self.max_rel_err > self.tolerance:
            out.append(f"results differ from the NumPy reference: max rel err {self.max_rel_err:.2e} "
                       f"> {self.tolerance:.0e}")
        return out


def _index_sources(graph: Graph) -> list[tuple[Node, int]]:
    """(input or parameter, range) for each argument read, through reshapes, as class labels or gather
    indices (a captured index tensor such as the positions is a parameter)."""
    found = []
    for node in graph.nodes:
        if node.op == "one_hot":
            source, size = node.inputs[0], int(node.attr("classes"))
        elif node.op in ("take", "gather"):
            source, size = node.inputs[1], int(node.inputs[0].shape[node.attr("axis")])
        else:
            continue
        while source.op == "reshape":
            source = source.inputs[0]
        if source in graph.inputs or source in graph.params:
            found.append((source, size))
    return found


def _condition_sources(graph: Graph) -> list[Node]:
    """Inputs or parameters read, through reshapes, as the condition of a ``where`` (masks)."""
    found = []
    for node in graph.nodes:
        if node.op != "where":
            continue
        source = node.inputs[0]
        while source.op == "reshape":
            source = source.inputs[0]
        if source in graph.inputs or source in graph.params:
            found.append(source)
    return found


def random_arguments(graph: Graph, batch: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs from a standard normal, except class labels and gather indices (whole numbers in range)
    and masks (0 or 1, true with probability MASKED: a mask of attention scores that hid every
    key of a query would make the reference's softmax NaN); parameters in (0.05, 0.95) (valid
    Adam moments and bias-correction powers)."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal([batch if d == "N" else d for d in n.shape]).astype(n.dtype) for n in graph.inputs]
    params = [rng.uniform(0.05, 0.95, [int(d) for d in n.shape]).astype(n.dtype) for n in graph.params]

    def put(source: Node, draw: Any) -> None:
        held = graph.inputs if source in graph.inputs else graph.params
        arrays, i = (inputs if held is graph.inputs else params), held.index(source)
        arrays[i] = draw(arrays[i].shape).astype(arrays[i].dtype)

    for source, size in _index_sources(graph):
        put(source, lambda shape, size=size: rng.integers(0, size, shape))
    for source in _condition_sources(graph):
        put(source, lambda shape: rng.random(shape) < MASKED)
    return inputs, params


def max_rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest |got - want| over all results, each relative to max(1, max |want|) of its result."""
    err = 0.0
    for g, w in zip(got, want):
        w = np.asarray(w, np.float64)
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        diff = np.abs(np.asarray(g, np.float64).reshape(w.shape) - w)
        err = max(err, float(np.nan_to_num(np.max(diff, initial=0.0), nan=np.inf)) / scale)
    return err


def check_program(graph: Graph, gpu_text: str, plan: dict[str, Any], batch: int, seed: int = 0) -> SimtCheck:
    """Run a compiled step (its gpu text and plan) on the interpreter and compare with the reference."""
    inputs, params = random_arguments(graph, batch, seed)
    outputs, updates = evaluate(graph, inputs, [p.copy() for p in params], batch)
    got, report = SimtProgram(gpu_text, plan).run(inputs + params)
    dtype = graph.params[0].dtype if graph.params else graph.inputs[0].dtype
    return SimtCheck(report, max_rel_err(got, list(outputs) + list(updates)), TOLERANCE[dtype])


def check_graph(graph: Graph, batch: int, seed: int = 0, program: Any = None) -> SimtCheck:
    """Check ``program`` (default: ``graph`` compiled for CUDA, kernels and plan only) at ``batch``."""
    from mlir_nn.backends.cuda import compile_graph

    program = program or compile_graph(graph, (), cubin=False)
    return check_program(graph, program.gpu_text, program.plan, batch, seed)
