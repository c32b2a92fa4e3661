"""The native first tier's baseline compiler: a traced float32 step straight to LLVM IR, no MLIR.

For a step of the ops it knows (``EXPRESSIONS``, ``REDUCTIONS``, ``matmul``, ``transpose``), the
graph becomes one LLVM function in a few milliseconds of Python, which LLVM's JIT compiles at
-O0 (``llvm_jit``): neither MLIR's library, its bindings nor the pass pipeline load or run, which
took most of a small step's first call (8x64 SGD MLP, batch 128, Zen 3: imports 0.15 s,
emission 0.05 s, passes 0.15 s and LLVM 0.15 s of 0.45-0.55 s). Anything else (another op, a
dtype other than float32, a shape with the batch twice) gets ``None`` and takes the MLIR path.

The code is plain: element-wise ops whose value has one use, by an element-wise op or a
reduction of the same shape, are computed inside their user's loop (no buffer between them);
every other value gets a buffer of the workspace (``workspace.MemoryPlan``: a fixed part and a
part per batch row, reused once a value is dead), or is written straight into the step's output
or, for a parameter's update, into the parameter itself when nothing reads the parameter's old
value afterwards (else at the end, from the workspace). Element-wise loops go ``LANES`` floats at
a time (LLVM vector types, which code generation at -O0 keeps as vector instructions: steps up
to 1.8x faster than scalar loops), then one by one; so do sums to rows, along their columns.
Products call the C GEMM (``gemm``), sums accumulate in float64. The function takes the packed
arguments of ``CpuExecutable``: one memref descriptor per input, parameter and output, then the workspace's.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlir_nn.backends import gemm
from mlir_nn.backends.cpu import Kernel
from mlir_nn.backends.llvm_jit import Jit
from mlir_nn.backends.native import NativeFunction
from mlir_nn.backends.workspace import HEADER, MemoryPlan
from mlir_nn.ir import Graph, Node
from mlir_nn.ir.ops import sum_to_axes
from mlir_nn.ir.shapes import BATCH
from mlir_nn.support.switches import switch

SWITCH = "MLIR_NN_BASELINE"
GEMM = "mlirnn_gemm_f32"
# element-wise ops: operands' values (SSA names) -> their value, emitted through the builder
Expression = Callable[["_Function", Node, list[str]], str]


def _binary(instruction: str) -> Expression:
    return lambda f, node, xs: f.op(f"{instruction} {f.t} {xs[0]}, {xs[1]}")


def _call(function: str) -> Expression:
    return lambda f, node, xs: f.call(function, xs[0])


def _pow(f: _Function, node: Node, xs: list[str]) -> str:
    e = float(node.attr("exponent"))
    if e == 2.0:
        return f.op(f"fmul {f.t} {xs[0]}, {xs[0]}")
    return f.op(f"call {f.t} @{f.intrinsic('pow')}({f.t} {xs[0]}, {f.t} {f.constant(e)})")


def _relu(f: _Function, node: Node, xs: list[str]) -> str:
    negative = f.op(f"fcmp olt {f.t} {xs[0]}, {f.constant(0.0)}")  # NaN stays NaN, as np.maximum's
    return f.op(f"select {f.bits} {negative}, {f.t} {f.constant(0.0)}, {f.t} {xs[0]}")


def _relu_grad(f: _Function, node: Node, xs: list[str]) -> str:
    positive = f.op(f"fcmp ogt {f.t} {xs[0]}, {f.constant(0.0)}")
    return f.op(f"select {f.bits} {positive}, {f.t} {xs[1]}, {f.t} {f.constant(0.0)}")


def _sigmoid(f: _Function, node: Node, xs: list[str]) -> str:
    """Stable: exp only of -|x| (as the reference's)."""
    e = f.call(f.intrinsic("exp"), f.op(f"fneg {f.t} {f.call(f.intrinsic('fabs'), xs[0])}"))
    one = f.constant(1.0)
    denominator = f.op(f"fadd {f.t} {one}, {e}")
    positive = f.op(f"fcmp oge {f.t} {xs[0]}, {f.constant(0.0)}")
    return f.op(f"select {f.bits} {positive}, {f.t} {f.op(f'fdiv {f.t} {one}, {denominator}')}, "
                f"{f.t} {f.op(f'fdiv {f.t} {e}, {denominator}')}")


def _tanh_grad(f: _Function, node: Node, xs: list[str]) -> str:
    square = f.op(f"fmul {f.t} {xs[0]}, {xs[0]}")
    return f.op(f"fmul {f.t} {xs[1]}, {f.op(f'fsub {f.t} {f.constant(1.0)}, {square}')}")


def _sigmoid_grad(f: _Function, node: Node, xs: list[str]) -> str:
    rest = f.op(f"fsub {f.t} {f.constant(1.0)}, {xs[0]}")
    return f.op(f"fmul {f.t} {f.op(f'fmul {f.t} {xs[1]}, {xs[0]}')}, {rest}")


def _mse_grad(f: _Function, node: Node, xs: list[str]) -> str:
    """2 * (p - y) * g / numel(p), the scale in float32 as the reference's."""
    count = f.splat(f.op(f"uitofp i64 {f.numel(node.shape)} to float"))
    scale = f.op(f"fdiv {f.t} {f.op(f'fmul {f.t} {f.constant(2.0)}, {xs[2]}')}, {count}")
    return f.op(f"fmul {f.t} {f.op(f'fsub {f.t} {xs[0]}, {xs[1]}')}, {scale}")


EXPRESSIONS: dict[str, Expression] = {
    "add": _binary("fadd"),
    "sub": _binary("fsub"),
    "mul": _binary("fmul"),
    "div": _binary("fdiv"),
    "neg": lambda f, node, xs: f.op(f"fneg {f.t} {xs[0]}"),
    "broadcast_to": lambda f, node, xs: xs[0],
    "pow": _pow,
    "relu": _relu,
    "relu_grad": _relu_grad,
    "exp": lambda f, node, xs: f.call(f.intrinsic("exp"), xs[0]),
    "log": lambda f, node, xs: f.call(f.intrinsic("log"), xs[0]),
    "sqrt": lambda f, node, xs: f.call(f.intrinsic("sqrt"), xs[0]),
    "tanh": _call("tanhf"),
    "sigmoid": _sigmoid,
    "tanh_grad": _tanh_grad,
    "sigmoid_grad": _sigmoid_grad,
    "mse_grad": _mse_grad,
}
LANES = 8  # floats per step of a flat loop's vector part (then one by one)
SCALAR_ONLY = ("tanh",)  # libm's, which has no vector form: computed one element at a time
REDUCTIONS = ("sum_to", "mse")  # sums (float64) over the shape of their first operand
LEAVES = ("input", "param", "const")
VECTOR = f"<{LANES} x float>"


def _declarations() -> str:
    """What the step calls: LLVM's math on floats and vectors, memset, memcpy and the C GEMM
    (each 2-D memref as its descriptor's words)."""
    memref = ", ".join(["ptr", "ptr"] + ["i64"] * 5)
    lines = ["declare float @llvm.pow.f32(float, float)", f"declare {VECTOR} @llvm.pow.v{LANES}f32({VECTOR}, {VECTOR})",
             "declare float @tanhf(float)", "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
             "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)",
             f"declare void @{GEMM}(i64, i64, {memref}, {memref}, {memref})"]
    for name in ("exp", "log", "sqrt", "fabs"):
        lines += [f"declare float @llvm.{name}.f32(float)", f"declare {VECTOR} @llvm.{name}.v{LANES}f32({VECTOR})"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BaselineCode:
    """A step's LLVM IR (``symbol``: its packed entry point) and the workspace it takes."""

    text: str
    symbol: str
    plan: MemoryPlan


def _float(value: float) -> str:
    """An LLVM float constant: the float32 value, as LLVM writes it (the double's bits in hex)."""
    bits = struct.unpack("<Q", struct.pack("<d", float(np.float32(value))))[0]
    return f"0x{bits:016X}"


def _supported(graph: Graph) -> bool:
    for node in graph.nodes:
        if node.dtype != "float32" or sum(d == BATCH for d in node.shape) > 1:
            return False
        if node.op in LEAVES or node.op in EXPRESSIONS or node.op in REDUCTIONS:
            continue
        if node.op == "matmul":
            continue
        if node.op == "transpose":
            continue
        return False
    batched = any(BATCH in n.shape for n in graph.nodes)
    names = [name for name, _ in graph.updates]
    values = [node for _, node in graph.updates]
    return ((not batched or any(BATCH in n.shape for n in graph.inputs)) and len(set(names)) == len(names)
            and len(set(values)) == len(values) and all(v.op not in LEAVES for v in values))


class _Function:
    """The step's function as it is written: SSA values, blocks and loops."""

    def __init__(self, batch: str) -> None:
        self.lines: list[str] = []
        self.count = 0
        self.block = "entry"
        self.batch = batch  # the SSA value of the batch size
        self.allocas: list[str] = []  # at the entry block's start
        self.lanes = 1  # of the values computed: LANES in a flat loop's vector part

    def value(self) -> str:
        self.count += 1
        return f"%v{self.count}"

    def op(self, text: str) -> str:
        """``%vK = text``: its name."""
        name = self.value()
        self.lines.append(f"  {name} = {text}")
        return name

    def emit(self, text: str) -> None:
        self.lines.append(f"  {text}")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name

    @property
    def t(self) -> str:
        """The type of the values computed: a float, or a vector of ``LANES`` (``lanes``)."""
        return VECTOR if self.lanes > 1 else "float"

    @property
    def bits(self) -> str:
        return f"<{LANES} x i1>" if self.lanes > 1 else "i1"

    def intrinsic(self, name: str) -> str:
        return f"llvm.{name}.v{LANES}f32" if self.lanes > 1 else f"llvm.{name}.f32"

    def call(self, function: str, x: str) -> str:
        return self.op(f"call {self.t} @{function}({self.t} {x})")

    def splat(self, scalar: str) -> str:
        """The float ``scalar`` as a value of type ``t``."""
        if self.lanes == 1:
            return scalar
        first = self.op(f"insertelement {VECTOR} poison, float {scalar}, i64 0")
        return self.op(f"shufflevector {VECTOR} {first}, {VECTOR} poison, <{LANES} x i32> zeroinitializer")

    def constant(self, value: float) -> str:
        return self.splat(_float(value))

    def load(self, pointer: str, index: str, lanes: int = 1) -> str:
        """The float at ``pointer[index]``, or the ``lanes`` from there."""
        kind = VECTOR if lanes > 1 else "float"
        return self.op(f"load {kind}, ptr {self.op(f'getelementptr float, ptr {pointer}, i64 {index}')}, align 4")

    def store(self, value: str, pointer: str, index: str) -> None:
        """``pointer[index] = value`` (``t``: the ``lanes`` from there)."""
        self.emit(f"store {self.t} {value}, ptr {self.op(f'getelementptr float, ptr {pointer}, i64 {index}')}, align 4")

    def extent(self, d: int | str) -> str:
        return self.batch if d == BATCH else str(d)

    def numel(self, shape: tuple) -> str:
        """The element count of ``shape`` as an i64 operand."""
        fixed = math.prod(int(d) for d in shape if d != BATCH)
        return self.op(f"mul i64 {self.batch}, {fixed}") if BATCH in shape else str(fixed)

    def loop(self, extent: str, body: Callable[[str], None], start: str = "0", step: int = 1) -> None:
        """for (i = start; i < extent; i += step) body(i)."""
        self.count += 1
        k, before = self.count, self.block
        head, inside, done = f"head{k}", f"body{k}", f"done{k}"
        self.emit(f"br label %{head}")
        self.label(head)
        index, following = f"%i{k}", f"%n{k}"
        phi = len(self.lines)
        self.lines.append("")  # the phi, once the body's last block is known
        self.emit(f"br i1 {self.op(f'icmp slt i64 {index}, {extent}')}, label %{inside}, label %{done}")
        self.label(inside)
        body(index)
        self.emit(f"{following} = add i64 {index}, {step}")
        self.emit(f"br label %{head}")
        self.lines[phi] = f"  {index} = phi i64 [{start}, %{before}], [{following}, %{self.block}]"
        self.label(done)

    def nest(self, extents: list[str], body: Callable[[list[str]], None], indices: tuple[str, ...] = ()) -> None:
        """Loops over ``extents`` (outermost first); ``body`` gets their indices."""
        if not extents:
            body(list(indices))
            return
        self.loop(extents[0], lambda i: self.nest(extents[1:], body, (*indices, i)))


def _strides(shape: tuple, within: tuple) -> list[int | str]:
    """Element strides of a row-major array of ``shape`` broadcast (right-aligned) over ``within``:
    each an int (0 along a broadcast axis) or "B*k", k times the batch size (``_index``)."""
    strides: list[int | str] = [0] * len(within)
    step: int | str = 1
    lead = len(within) - len(shape)
    for k in range(len(shape) - 1, -1, -1):
        size = shape[k]
        if size != 1 or within[lead + k] == 1:
            strides[lead + k] = step if size == within[lead + k] else 0
        if size == BATCH:
            step = f"B*{step}" if isinstance(step, int) else step
        elif isinstance(step, int):
            step *= int(size)
        else:
            step = f"B*{int(step[2:]) * int(size)}"
    return strides


class _Emitter:
    """One graph to one function: which values get buffers, where, and the code."""

    def __init__(self, graph: Graph, symbol: str) -> None:
        self.graph = graph
        self.symbol = symbol
        self.users: dict[Node, list[Node]] = {n: [] for n in graph.nodes}
        for node in graph.nodes:
            for i in dict.fromkeys(node.inputs):
                self.users[i].append(node)
        ends = {n for n in graph.outputs} | {n for _, n in graph.updates}
        self.inlined = {n for n in graph.nodes if self._inlines(n, ends)}
        self.folded: set[Node] = set()  # transposes that only products read (passed with a flag)
        for n in graph.nodes:
            if (n.op == "transpose" and len(n.shape) == 2 and n not in ends and n.inputs[0] not in self.folded
                    and all(u.op == "matmul" for u in self.users[n])):
                self.folded.add(n)
        self.order = [n for n in graph.nodes if n.op not in LEAVES and n not in self.inlined and n not in self.folded]
        self.position = {n: k for k, n in enumerate(self.order)}
        self.f = _Function("%batch")
        self.pointers: dict[Node, str] = {}  # materialized value -> its buffer's pointer (SSA)

    def _inlines(self, node: Node, ends: set[Node]) -> bool:
        """True for an element-wise value computed inside its only user's loop."""
        users = self.users[node]
        if node.op not in EXPRESSIONS or node in ends or len(users) != 1:
            return False
        user = users[0]
        if sum(i is node or i == node for i in user.inputs) != 1:
            return False
        space = user.inputs[0].shape if user.op in REDUCTIONS else user.shape
        return (user.op in EXPRESSIONS or user.op in REDUCTIONS) and node.shape == space

    def reads(self, node: Node) -> set[Node]:
        """The stored values (leaves, materialized nodes) that computing ``node`` reads."""
        found: set[Node] = set()
        stack = list(node.inputs)
        while stack:
            value = stack.pop()
            if value in self.inlined or value in self.folded:
                stack.extend(value.inputs)
            elif value.op != "const":
                found.add(value)
        return found

    # -- where values live

    def plan(self) -> tuple[dict[Node, tuple[str, int]], dict[str, Node], MemoryPlan]:
        """Each materialized value's home: ("output", k), ("param", k) or ("fixed"/"rows", byte
        offset) in the workspace; the updates copied at the end (param name -> value); the plan."""
        graph = self.graph
        params = {p.attr("name"): k for k, p in enumerate(graph.params)}
        readers: dict[Node, list[int]] = {}
        for node in self.order:
            for value in self.reads(node):
                readers.setdefault(value, []).append(self.position[node])
        homes: dict[Node, tuple[str, int]] = {}
        for k, node in enumerate(graph.outputs):
            if node.op not in LEAVES and graph.outputs.count(node) == 1:
                homes[node] = ("output", k)
        copied: dict[str, Node] = {}
        for name, value in graph.updates:
            param = graph.params[params[name]]
            in_place = (value.op in EXPRESSIONS and value.shape == param.shape and value not in homes
                        and all(r <= self.position[value] for r in readers.get(param, [])))
            if in_place:
                homes[value] = ("param", params[name])
            else:
                copied[name] = value
        end = len(self.order)
        last = {n: max(readers.get(n, [self.position[n]])) for n in self.order}
        for value in copied.values():
            last[value] = end
        for node in graph.outputs:
            if node in last:
                last[node] = end
        pools: dict[str, list[tuple[int, int, int]]] = {"fixed": [], "rows": []}  # (offset, size, last use)
        sizes = {"fixed": 0, "rows": 0}
        for node in self.order:
            if node in homes:
                continue
            pool = "rows" if BATCH in node.shape else "fixed"
            size = -(-4 * math.prod(1 if d == BATCH else int(d) for d in node.shape) // 64) * 64
            live = [b for b in pools[pool] if b[2] >= self.position[node]]
            offset = 0
            for start, length, _ in sorted(live):
                if start - offset >= size:
                    break
                offset = max(offset, start + length)
            pools[pool] = live + [(offset, size, last[node])]
            sizes[pool] = max(sizes[pool], offset + size)
            homes[node] = (pool, offset)
        fixed = -(-sizes["fixed"] // 64) * 64
        plan = MemoryPlan((fixed, sizes["rows"]), len(self.order), 0)
        self.fixed_bytes = fixed
        return homes, copied, plan

    # -- the function

    def build(self) -> BaselineCode:
        graph, f = self.graph, self.f
        homes, copied, plan = self.plan()
        inputs, params, outputs = len(graph.inputs), len(graph.params), len(graph.outputs)

        def descriptor(k: int) -> str:
            cell = f.op(f"load ptr, ptr {f.op(f'getelementptr ptr, ptr %args, i64 {k}')}")
            return f.op(f"load ptr, ptr {cell}")

        def data(k: int) -> str:
            """The first element of argument ``k`` (its aligned pointer plus offset)."""
            d = descriptor(k)
            aligned = f.op(f"load ptr, ptr {f.op(f'getelementptr i64, ptr {d}, i64 1')}")
            offset = f.op(f"load i64, ptr {f.op(f'getelementptr i64, ptr {d}, i64 2')}")
            return f.op(f"getelementptr float, ptr {aligned}, i64 {offset}")

        batch_input = next((k for k, n in enumerate(graph.inputs) if BATCH in n.shape), None)
        if batch_input is None:
            f.emit("%batch = add i64 1, 0")
        else:
            dim = graph.inputs[batch_input].shape.index(BATCH)
            d = descriptor(batch_input)
            f.emit(f"%batch = load i64, ptr {f.op(f'getelementptr i64, ptr {d}, i64 {3 + dim}')}")
        for k, node in enumerate(graph.inputs):
            self.pointers[node] = data(k)
        for k, node in enumerate(graph.params):
            self.pointers[node] = data(inputs + k)
        output_pointers = [data(inputs + params + k) for k in range(outputs)]
        workspace = data(inputs + params + outputs)
        base = f.op(f"getelementptr i8, ptr {workspace}, i64 {HEADER}")
        rows = f.op(f"getelementptr i8, ptr {base}, i64 {self.fixed_bytes}")
        for node, (kind, where) in homes.items():
            if kind == "output":
                self.pointers[node] = output_pointers[where]
            elif kind == "param":
                self.pointers[node] = self.pointers[graph.params[where]]
            elif kind == "fixed":
                self.pointers[node] = f.op(f"getelementptr i8, ptr {base}, i64 {where}")
            else:
                self.pointers[node] = f.op(f"getelementptr [64 x i8], ptr {rows}, "
                                           f"i64 {f.op(f'mul i64 %batch, {where // 64}')}")
        leaf_outputs = [(k, n) for k, n in enumerate(graph.outputs) if n.op in LEAVES]
        for k, node in leaf_outputs:
            self._store_scalar_or_copy(output_pointers[k], node)
        for node in self.order:
            self._compute(node)
        for k, node in enumerate(graph.outputs):
            if node.op not in LEAVES and homes.get(node) != ("output", k):
                self._copy(output_pointers[k], self.pointers[node], node.shape)
        names = {p.attr("name"): p for p in graph.params}
        for name, value in copied.items():
            self._copy(self.pointers[names[name]], self.pointers[value], value.shape)
        f.emit("ret void")
        body = "\n".join(f.allocas + f.lines)
        text = (f"{_declarations()}\ndefine void @{self.symbol}(ptr %args) {{\nentry:\n{body}\n}}\n")
        return BaselineCode(text, self.symbol, plan)

    def _bytes(self, shape: tuple) -> str:
        return self.f.op(f"mul i64 {self.f.numel(shape)}, 4")

    def _copy(self, target: str, source: str, shape: tuple) -> None:
        self.f.emit(f"call void @llvm.memcpy.p0.p0.i64(ptr {target}, ptr {source}, i64 {self._bytes(shape)}, i1 false)")

    def _store_scalar_or_copy(self, target: str, node: Node) -> None:
        if node.op == "const":
            self.f.emit(f"store float {_float(node.attr('value'))}, ptr {target}")
        else:
            self._copy(target, self.pointers[node], node.shape)

    def _index(self, indices: list[str], strides: list[int | str]) -> str:
        """sum of index * stride (strides as ``_strides`` gives them)."""
        f = self.f
        total = "0"
        for index, stride in zip(indices, strides):
            if stride == 0:
                continue
            if isinstance(stride, str):
                factor = int(stride[2:])
                scaled = f.op(f"mul i64 %batch, {factor}") if factor != 1 else "%batch"
                term = f.op(f"mul i64 {index}, {scaled}")
            else:
                term = index if stride == 1 else f.op(f"mul i64 {index}, {stride}")
            total = term if total == "0" else f.op(f"add i64 {total}, {term}")
        return total

    def _load(self, node: Node, indices: list[str], space: tuple) -> str:
        """The value of a stored ``node`` at ``indices`` of the iteration ``space`` (broadcast)."""
        if node.op == "const":
            return self.f.constant(node.attr("value"))
        strides = _strides(node.shape, space)
        at = self._index(indices, strides)
        if self.f.lanes > 1 and strides[-1] == 0:  # the same for the lanes along the last axis
            return self.f.splat(self.f.load(self.pointers[node], at))
        return self.f.load(self.pointers[node], at, self.f.lanes)

    def _value(self, node: Node, indices: list[str], space: tuple) -> str:
        """``node``'s value at ``indices`` of ``space``: loaded, or computed (inlined)."""
        if node not in self.inlined:
            return self._load(node, indices, space)
        operands = [self._value(i, indices, space) for i in node.inputs]
        return EXPRESSIONS[node.op](self.f, node, operands)

    def _compute(self, node: Node) -> None:
        f = self.f
        if node.op == "matmul":
            self._matmul(node)
            return
        if node.op == "transpose":
            perm = node.attr("perm")
            source = _strides(node.inputs[0].shape, node.inputs[0].shape)
            strides = [source[p] for p in perm]
            target = self.pointers[node]
            out = _strides(node.shape, node.shape)

            def move(indices: list[str]) -> None:
                value = f.load(self.pointers[node.inputs[0]], self._index(indices, strides))
                f.store(value, target, self._index(indices, out))

            f.nest([f.extent(d) for d in node.shape], move)
            return
        if node.op in REDUCTIONS:
            self._reduce(node)
            return
        target = self.pointers[node]
        space = node.shape
        out = _strides(space, space)

        def element(indices: list[str]) -> None:
            operands = [self._value(i, indices, space) for i in node.inputs]
            value = EXPRESSIONS[node.op](f, node, operands)
            f.store(value, target, self._index(indices, out))

        vector = not any(n.op in SCALAR_ONLY for n in self._computed(node))
        stored = self.reads(node)
        if all(s.shape == space or math.prod(1 if d == BATCH else int(d) for d in s.shape) == 1
               and BATCH not in s.shape for s in stored):  # one flat loop
            count = f.numel(space)
            start = "0"
            if vector:  # LANES at a time, then the rest
                start = self._lanes(count, lambda i: self._flat(node, i, target))
            f.loop(count, lambda i: self._flat(node, i, target), start=start)
        elif not space:
            element([])
        else:  # rows: along the last axis every stored operand is contiguous or the same (broadcast)

            def row(outer: list[str]) -> None:
                start = self._lanes(f.extent(space[-1]), lambda j: element([*outer, j])) if vector else "0"
                f.loop(f.extent(space[-1]), lambda j: element([*outer, j]), start=start)

            f.nest([f.extent(d) for d in space[:-1]], row)

    def _lanes(self, count: str, body: Callable[[str], None]) -> str:
        """``body`` at 0, LANES, ... up to the last multiple of LANES in ``count``, each time for
        LANES elements (``f.lanes``); that multiple."""
        f = self.f
        whole = f.op(f"and i64 {count}, {-LANES}")
        f.lanes = LANES
        f.loop(whole, body, step=LANES)
        f.lanes = 1
        return whole

    def _computed(self, node: Node) -> list[Node]:
        """``node`` and the values computed inside its loop (``inlined``)."""
        found, stack = [node], [i for i in node.inputs if i in self.inlined]
        while stack:
            found.append(stack.pop())
            stack.extend(i for i in found[-1].inputs if i in self.inlined)
        return found

    def _flat(self, node: Node, i: str, target: str) -> None:
        """Element ``i`` (or the ``f.lanes`` from there) of a value whose stored operands have its
        shape or one element."""
        f = self.f

        def value(n: Node) -> str:
            if n in self.inlined:
                return EXPRESSIONS[n.op](f, n, [value(x) for x in n.inputs])
            if n.op == "const":
                return f.constant(n.attr("value"))
            if n.shape == node.shape:
                return f.load(self.pointers[n], i, f.lanes)
            return f.splat(f.load(self.pointers[n], "0"))

        result = EXPRESSIONS[node.op](f, node, [value(x) for x in node.inputs])
        f.store(result, target, i)

    def _reduce(self, node: Node) -> None:
        """sum_to: sums over the broadcast axes; mse: the mean of the squared difference. In
        float64, output elements outer, summed axes inner; LANES output elements at a time along
        the last axis when it is not summed."""
        f = self.f
        space = node.inputs[0].shape
        if node.op == "sum_to":
            axes, _ = sum_to_axes(space, node.shape)
        else:
            axes = tuple(range(len(space)))
        kept = [k for k in range(len(space)) if k not in axes]
        order = kept + list(axes)
        target = self.pointers[node]
        out = _strides(tuple(1 if k in axes else d for k, d in enumerate(space)), space) if node.op == "sum_to" \
            else [0] * len(space)
        totals = {1: f.value(), LANES: f.value()}  # the running sum: a double, or LANES of them
        f.allocas += [f"  {totals[1]} = alloca double", f"  {totals[LANES]} = alloca <{LANES} x double>"]

        def outer(kept_indices: list[str]) -> None:
            wide = f"<{LANES} x double>" if f.lanes > 1 else "double"
            total = totals[f.lanes]
            f.emit(f"store {wide} zeroinitializer, ptr {total}")

            def inner(summed: list[str]) -> None:
                indices = [""] * len(space)
                for k, index in zip(order, kept_indices + summed):
                    indices[k] = index
                if node.op == "sum_to":
                    term = f.op(f"fpext {f.t} {self._value(node.inputs[0], indices, space)} to {wide}")
                else:
                    difference = f.op(f"fsub float {self._value(node.inputs[0], indices, space)}, "
                                      f"{self._value(node.inputs[1], indices, space)}")
                    precise = f.op(f"fpext float {difference} to double")
                    term = f.op(f"fmul double {precise}, {precise}")
                running = f.op(f"load {wide}, ptr {total}")
                f.emit(f"store {wide} {f.op(f'fadd {wide} {running}, {term}')}, ptr {total}")

            f.nest([f.extent(space[k]) for k in axes], inner)
            result = f.op(f"load {wide}, ptr {total}")
            if node.op == "mse":
                result = f.op(f"fdiv double {result}, {f.op(f'uitofp i64 {f.numel(space)} to double')}")
            indices = [""] * len(space)
            for k, index in zip(kept, kept_indices):
                indices[k] = index
            at = self._index([indices[k] if k in kept else "0" for k in range(len(space))], out)
            f.store(f.op(f"fptrunc {wide} {result} to {f.t}"), target, at)

        last = len(space) - 1
        if node.op == "sum_to" and kept and kept[-1] == last and not any(
                n.op in SCALAR_ONLY for n in self._computed(node)):

            def row(outer_indices: list[str]) -> None:
                start = self._lanes(f.extent(space[last]), lambda j: outer([*outer_indices, j]))
                f.loop(f.extent(space[last]), lambda j: outer([*outer_indices, j]), start=start)

            f.nest([f.extent(space[k]) for k in kept[:-1]], row)
        else:
            f.nest([f.extent(space[k]) for k in kept], outer)

    def _matmul(self, node: Node) -> None:
        """C = op(A) op(B) by the C GEMM (which adds to C: zeroed first); a transposed operand is
        passed as stored with its flag."""
        f = self.f
        operands = []
        for operand, flag in zip(node.inputs, ("transpose_a", "transpose_b")):
            folded = operand in self.folded
            operands.append((int(folded != bool(node.attr(flag))), operand.inputs[0] if folded else operand))
        target = self.pointers[node]
        f.emit(f"call void @llvm.memset.p0.i64(ptr {target}, i8 0, i64 {self._bytes(node.shape)}, i1 false)")
        arguments = [f"i64 {operands[0][0]}", f"i64 {operands[1][0]}"]
        for pointer, shape in [(self.pointers[s], s.shape) for _, s in operands] + [(target, node.shape)]:
            rows, columns = (f.extent(d) for d in shape)
            arguments += [f"ptr {pointer}", f"ptr {pointer}", "i64 0", f"i64 {rows}", f"i64 {columns}",
                          f"i64 {columns}", "i64 1"]
        f.emit(f"call void @{GEMM}({', '.join(arguments)})")


def emit_step(graph: Graph) -> BaselineCode | None:
    """The step's LLVM IR, or None when it has an op, dtype or shape this compiler does not take."""
    if not _supported(graph):
        return None
    return _Emitter(graph, f"mlirnn_baseline_{graph.name}").build()


def enabled() -> bool:
    """``$MLIR_NN_BASELINE`` (default 1): the native first tier compiles the steps it can with
    this compiler; 0 sends every step through MLIR."""
    return switch(SWITCH, True, "the native first tier compiles steps it can straight to LLVM IR")


def compile_step(graph: Graph) -> Kernel | None:
    """The step compiled by LLVM's JIT at -O0 from ``emit_step``'s IR, or None
    when this compiler does not take it or it is switched off (``enabled``). Its IR is the
    "llvm-ir" stage."""
    if not enabled():
        return None
    start = time.perf_counter()
    code = emit_step(graph)
    if code is None:
        return None
    timings = {"codegen": time.perf_counter() - start}
    start = time.perf_counter()
    if GEMM in code.text:
        gemm.load()  # the JIT finds it among the process's symbols
    jit = Jit(code.text, graph.name)
    native = NativeFunction(jit.lookup(code.symbol), jit, code.symbol)
    timings["llvm"] = time.perf_counter() - start
    return Kernel(native, {"llvm-ir": code.text}, code.plan, timings, opt_level=0)
