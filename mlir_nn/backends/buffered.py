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

A parameter's new value is written into the parameter itself when an element-wise op makes
it after every read of the old value, and after every op that may raise (``in_place``): the
new values of a 16-layer 1024-wide MLP's weights and Adam moments held 192 MB of buffers until
the end of the step, and a first call spends most of its time faulting in fresh memory. From
the first such write on, a Ctrl-C waits until the step has ended, so that the parameters are
written either whole or not at all, as by the reference.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlir_nn.backends.reference import ReferenceExecutable, check_bound, own, run_node
from mlir_nn.ir import Graph, Node
from mlir_nn.ir.arguments import check_arguments
from mlir_nn.ir.ops import sum_to_axes
from mlir_nn.ir.shapes import resolve
from mlir_nn.support.interrupts import interrupts_deferred

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


def _sum_to(args: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    axes, _ = sum_to_axes(args[0].shape, tuple(attrs["shape"]))
    if not axes:
        np.copyto(out, args[0].reshape(out.shape))
        return
    kept = tuple(1 if d in axes else n for d, n in enumerate(args[0].shape))
    np.sum(args[0], axis=axes, keepdims=True, out=out.reshape(kept))


def _log(args: list[np.ndarray], attrs: dict, out: np.ndarray) -> None:
    with np.errstate(divide="ignore"):  # log(0) = -inf, silently, as its reference
        np.log(args[0], out=out)


def _ufunc(ufunc: np.ufunc) -> Kernel:
    return lambda args, attrs, out: ufunc(*args, out=out)


KERNELS: dict[str, Kernel] = {
    "add": _ufunc(np.add), "sub": _ufunc(np.subtract), "mul": _ufunc(np.multiply), "div": _ufunc(np.divide),
    "neg": _ufunc(np.negative), "sqrt": _ufunc(np.sqrt), "exp": _ufunc(np.exp), "tanh": _ufunc(np.tanh),
    "transpose": lambda args, attrs, out: np.copyto(out, np.transpose(args[0], attrs["perm"])),
    "broadcast_to": lambda args, attrs, out: np.copyto(out, args[0]),
    "relu": lambda args, attrs, out: np.maximum(args[0], 0, out=out),
    "relu_grad": _relu_grad, "matmul": _product, "linear": _linear, "matmul_relu_grad": _matmul_relu_grad,
    "sum_to": _sum_to, "log": _log,
}
FLOATS = ("float32", "float64")
# ops whose out= may be one of their operands (element by element)
ELEMENTWISE = ("add", "sub", "mul", "div", "neg", "sqrt", "exp", "log", "tanh", "relu", "pow")


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
    parameter: int | None = None  # the slot of the parameter it writes its new value into, if it does


@dataclass(frozen=True)
class Plan:
    """The instructions and buffers of one batch size; ``first_write``: the index of the first
    instruction that writes into a parameter (len(instructions) if none does)."""

    instructions: list[Instruction]
    buffers: list[np.ndarray]
    first_write: int


def in_place(graph: Graph, batch: int | None, last_use: dict[int, int]) -> dict[int, int]:
    """{node position: parameter slot} of the updates that may write into their parameter: an
    element-wise out= op (``ELEMENTWISE``) of the parameter's shape and dtype, that is no output,
    after the last read of the old value or of anything that may view it, and after the last op
    that runs its reference (those may raise; constants do not)."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    slot = {p.attr("name"): i for i, p in enumerate(graph.params)}
    bound = {*graph.inputs, *graph.params}
    referenced = [position[n] for n in graph.nodes if n not in bound and n.inputs and kernel(n) is None]
    tail = max(referenced, default=-1)
    outputs = set(graph.outputs)
    views: dict[Node, set[Node]] = {p: {p} for p in graph.params}  # node -> the parameters it may view
    for node in graph.nodes:
        if node not in bound and kernel(node) is None:
            views[node] = set().union(*(views.get(i, set()) for i in node.inputs))
    found = {}
    for name, update in graph.updates:
        param, at = graph.params[slot[name]], position[update]
        readers = [n for n, viewed in views.items() if param in viewed]
        if (at > tail and update.op in ELEMENTWISE and kernel(update) is not None and update not in outputs
                and resolve(update.shape, batch) == resolve(param.shape, batch) and update.dtype == param.dtype
                and all(last_use[position[n]] <= at for n in readers)):
            found[at] = slot[name]
    return found


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
    writes = in_place(graph, batch, last_use)
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
        if i in writes:
            pass  # its parameter is its buffer
        elif found is not None and i in outputs:
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
        instructions.append(Instruction(i, operands, node, node.attr_dict, shape, found, buffer, writes.get(i)))
    first_write = next((n for n, ins in enumerate(instructions) if ins.parameter is not None), len(instructions))
    return Plan(instructions, buffers, first_write)


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
        owned: set[int] = set()  # positions whose value is a planned buffer or a new array
        writes = step.first_write if _writable(inputs, params, step) else len(step.instructions)
        self._execute(step, step.instructions[:writes], values, params, owned, False)
        with interrupts_deferred():
            self._execute(step, step.instructions[writes:], values, params, owned, True)
            shared = [*inputs, *params, *step.buffers]
            outputs = [values[i] if i in owned else own(values[i], shared) for i in self._outputs]
            written = {ins.parameter for ins in step.instructions[writes:] if ins.parameter is not None}
            updates = [values[i] if i in owned else own(values[i], params) for i in self._updates]
            self._write_updates(params, [None if slot in written else update
                                         for slot, update in zip(self._update_slots, updates)])
        return outputs

    @staticmethod
    def _execute(step: Plan, instructions: list[Instruction], values: list, params: list[np.ndarray], owned: set[int],
                 into_params: bool) -> None:
        """Run ``instructions``; with ``into_params``, those with a parameter write into it."""
        for ins in instructions:
            args = [values[o] for o in ins.operands]
            if ins.kernel is None:
                result = run_node(ins.node, args, ins.attrs, ins.shape)
            else:
                if ins.parameter is not None:  # a new array where its parameter may not be written early
                    result = params[ins.parameter] if into_params else np.empty(ins.shape, ins.node.dtype)
                else:
                    result = np.empty(ins.shape, ins.node.dtype) if ins.buffer == -1 else step.buffers[ins.buffer]
                ins.kernel(args, ins.attrs, result)
                owned.add(ins.position)
            values[ins.position] = result


def _writable(inputs: list[np.ndarray], params: list[np.ndarray], step: Plan) -> bool:
    """Whether ``step``'s parameters may be written in place: each is a writable array of its
    own (no argument shares its memory: a parameter passed twice, or one viewing an input), and
    NumPy's floating-point errors are not set to raise, so that no write is followed by an error."""
    if step.first_write == len(step.instructions) or any(v in ("raise", "call") for v in np.geterr().values()):
        return False
    slots = {ins.parameter for ins in step.instructions[step.first_write:] if ins.parameter is not None}
    if not all(params[slot].flags.writeable for slot in slots):
        return False
    shared = _overlapping([*params, *inputs])
    return not any(slot in shared for slot in slots)


def _overlapping(arrays: list[np.ndarray]) -> set[int]:
    """Positions of the non-empty ``arrays`` whose memory bounds overlap another's (as
    ``np.may_share_memory``), by one sort of the bounds instead of a test of every pair."""
    bounds = sorted((*_byte_bounds(a), n) for n, a in enumerate(arrays) if a.size)
    found: set[int] = set()
    reach, holder = -1, -1  # the furthest end among the arrays sorted so far, and whose it is
    for start, end, n in bounds:
        if start < reach:
            found.update((n, holder))
        if end > reach:
            reach, holder = end, n
    return found


def _byte_bounds(array: np.ndarray) -> tuple[int, int]:
    """The first byte of non-empty ``array`` and one past its last (its strides may be negative)."""
    start = end = array.ctypes.data
    for size, stride in zip(array.shape, array.strides):
        start, end = start + min(0, (size - 1) * stride), end + max(0, (size - 1) * stride)
    return start, end + array.itemsize
