"""The reference interpreter with reused buffers: the executable of the interpreter tier.

``ReferenceExecutable`` (the oracle) allocates a new array per node and call. Arrays of a
few hundred KB are allocated and freed through mmap, so every call pays page faults for
every large intermediate: an autoencoder's Adam step (784-256-64-16-64-256-784, batch 128,
one BLAS thread) took 24 ms that way and 7 ms with the buffers below (the reference with
glibc's mmap threshold raised from the environment: about 9 ms). Here the common ops write with ``out=`` (or copy)
into buffers planned once per batch size by liveness (a buffer is reused once every node
that reads it, or a view of it, has run); the others run their reference and may return
views, which keep the buffers they view alive. Each op computes exactly what its reference
computes (the same NumPy calls, in the same order), so results are identical to the oracle's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlir_nn.backends.reference import ReferenceExecutable, check_bound, own, run_node
from mlir_nn.ir import Graph, Node
from mlir_nn.ir.arguments import check_arguments
from mlir_nn.ir.shapes import resolve

Kernel = Callable[[list[np.ndarray], dict, np.ndarray], None]  # (args, attrs, out)


def _product(args: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    a = args[0].T if attrs.get("transpose_a") else args[0]
    b = args[1].T if attrs.get("transpose_b") else args[1]
    np.matmul(a, b, out=out)


def _linear(args: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    _product(args, attrs, out)
    np.add(out, args[2], out=out)
    if attrs.get("activation") == "relu":
        np.maximum(out, 0, out=out)


def _masked(mask: np.ndarray, out: np.ndarray) -> None:
    """``np.where(mask > 0, out, 0)`` in place (NaN in ``mask`` zeroes, as there)."""
    np.copyto(out, np.zeros((), out.dtype), where=np.logical_not(mask > 0))


def _relu_grad(args: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    np.copyto(out, args[1])
    _masked(args[0], out)


def _matmul_relu_grad(args: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    _product(args, attrs, out)
    _masked(args[2], out)


def _ufunc(ufunc: np.ufunc) -> Kernel:
    return lambda args, attrs, out: ufunc(*args, out=out)


KERNELS: dict[str, Kernel] = {
    "add": _ufunc(np.add), "sub": _ufunc(np.subtract), "mul": _ufunc(np.multiply), "div": _ufunc(np.divide),
    "neg": _ufunc(np.negative), "sqrt": _ufunc(np.sqrt), "exp": _ufunc(np.exp), "tanh": _ufunc(np.tanh),
    "transpose": lambda args, attrs, out: np.copyto(out, np.transpose(args[0], attrs["perm"])),
    "broadcast_to": lambda args, attrs, out: np.copyto(out, args[0]),
    "relu": lambda args, attrs, out: np.maximum(args[0], 0, out=out),
    "relu_grad": _relu_grad, "matmul": _product, "linear": _linear, "matmul_relu_grad": _matmul_relu_grad,
}
FLOATS = ("float32", "float64")


def kernel(node: Node) -> Kernel | None:
    """The ``out=`` form of ``node``'s op, when it has one and every operand has the node's
    (float) dtype; None: its reference runs."""
    found = KERNELS.get(node.op)
    if node.op == "pow" and node.attr("exponent") == 2.0:  # its reference: x * x
        found = lambda args, attrs, out: np.multiply(args[0], args[0], out=out)  # noqa: E731
    if found is None or node.dtype not in FLOATS or any(i.dtype != node.dtype for i in node.inputs):
        return None
    return found


@dataclass(frozen=True)
class Instruction:
    """One node: where its operands are, how it runs, and its buffer (-1: a new array per
    call, the step's outputs; None: its reference allocates)."""

    position: int
    operands: tuple[int, ...]
    node: Node
    attrs: dict
    shape: tuple[int, ...]
    kernel: Kernel | None
    buffer: int | None


@dataclass(frozen=True)
class Plan:
    """The instructions and buffers of one batch size."""

    instructions: list[Instruction]
    buffers: list[np.ndarray]


def plan(graph: Graph, batch: int | None) -> Plan:
    """Buffers for ``graph`` at ``batch`` by liveness; an output gets a new array per call."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    end = len(graph.nodes)
    last_use = dict.fromkeys(range(end), -1)
    for i, node in enumerate(graph.nodes):
        for operand in node.inputs:
            last_use[position[operand]] = i
    for node in [*graph.outputs, *(u for _, u in graph.updates)]:
        last_use[position[node]] = end
    outputs = {position[o] for o in graph.outputs}
    bound = {position[n] for n in (*graph.inputs, *graph.params)}
    buffers: list[np.ndarray] = []
    held_until: list[int] = []  # per buffer: the last use of any node that may alias it
    aliases: dict[int, set[int]] = {}  # node position -> the buffers its value may view
    instructions = []
    for i, node in enumerate(graph.nodes):
        if i in bound:
            continue
        shape = resolve(node.shape, batch)
        found = kernel(node)
        if found is None:
            check_bound(node)
        operands = tuple(position[o] for o in node.inputs)
        buffer = None
        if found is not None and i in outputs:
            buffer = -1
        elif found is not None:
            buffer = next((b for b, until in enumerate(held_until)
                           if until < i and buffers[b].shape == shape and buffers[b].dtype == node.dtype), None)
            if buffer is None:
                buffer = len(buffers)
                buffers.append(np.empty(shape, node.dtype))
                held_until.append(-1)
            held_until[buffer] = last_use[i]
            aliases[i] = {buffer}
        else:  # its reference may return a view of any operand
            aliases[i] = set().union(*(aliases.get(o, set()) for o in operands))
            for b in aliases[i]:
                held_until[b] = max(held_until[b], last_use[i])
        instructions.append(Instruction(i, operands, node, node.attr_dict, shape, found, buffer))
    return Plan(instructions, buffers)


class BufferedExecutable(ReferenceExecutable):
    """Runs ``graph`` as ``ReferenceExecutable`` does (same checks, results and update
    semantics), its intermediates in planned buffers: each thread's own, so threads (and a
    forked child) never share them."""

    def __init__(self, graph: Graph) -> None:
        super().__init__(graph)
        position = {node: i for i, node in enumerate(graph.nodes)}
        self._bound = [position[n] for n in (*graph.inputs, *graph.params)]
        self._outputs = [position[o] for o in graph.outputs]
        self._updates = [position[u] for _, u in graph.updates]
        self._local = threading.local()  # plans: {batch: Plan} of this thread (buffers are per thread)

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        batch = check_arguments(self.graph, inputs, params, labels=self._labels)
        if not hasattr(self._local, "plans"):
            self._local.plans = {}
        plans: dict[int | None, Plan] = self._local.plans
        step = plans.get(batch)
        if step is None:
            step = plans[batch] = plan(self.graph, batch)
        values: list = [None] * len(self.graph.nodes)
        for i, array in zip(self._bound, [*inputs, *params]):
            values[i] = array
        owned = set()  # positions whose value is a planned buffer or a new array
        for ins in step.instructions:
            args = [values[o] for o in ins.operands]
            if ins.kernel is None:
                result = run_node(ins.node, args, ins.attrs, ins.shape)
            else:
                result = np.empty(ins.shape, ins.node.dtype) if ins.buffer == -1 else step.buffers[ins.buffer]
                ins.kernel(args, ins.attrs, result)
                owned.add(ins.position)
            values[ins.position] = result
        shared = [*inputs, *params, *step.buffers]
        outputs = [values[i] if i in owned else own(values[i], shared) for i in self._outputs]
        self._write_updates(params, [values[i] if i in owned else own(values[i], params) for i in self._updates])
        return outputs
