"""A SIMT interpreter: outlined ``gpu.func`` kernels executed on the CPU, to check them without a GPU.

Every thread of the launch is a lane. Each SSA value is a NumPy array over the lanes
(or a scalar when all lanes agree); all threads run in lockstep between barriers, a
boolean mask saying which lanes are active (divergent ``scf.if`` branches and loops
whose trip count differs between threads run under a mask). Global memory is the
step's buffers, shared memory (workgroup attributions) one NumPy buffer per block.
Blocks are independent, so all blocks of a launch run together; a barrier synchronizes
within each block. While it runs it records:

* out-of-bounds accesses: an index outside the memref's sizes or the buffer;
* races: between two barriers, two threads of a block touching the same address with
  at least one write (shared and global memory), and over the whole launch, two blocks
  touching the same global address with at least one write;
* barriers under divergent control flow: a barrier that some, not all, threads of a
  block reach;
* async copies (``nvgpu.device_async_copy``, i.e. ``cp.async``): a copy reads its source
  when issued but writes shared memory only when its thread waits for its group
  (``device_async_create_group`` commits a thread's pending copies as one group,
  ``device_async_wait {numGroups = n}`` completes all but its ``n`` newest groups);
  until then any access to its destination, by any thread, is reported, and so is a copy
  never waited for. Sources past ``srcElements`` are not read and the rest of the
  destination is zero-filled. Misaligned vector loads and copies are reported too.

Lockstep is one legal schedule; the race check is what covers the others. Arithmetic is
NumPy's in the kernel's element type (float32 rounds after every operation, as
``mul.rn``/``add.rn`` do; a contracted ``fma`` on the device differs in the last bits).

``run_step`` runs a compiled step's launch plan (``mlir_nn.runtime.plan``: the same
allocations, copies, grids and packed kernel parameters the CUDA runtime uses) on
given inputs and parameters; ``check_step`` compares it with the NumPy reference.
New ops reach this interpreter as arith/math/memref/scf/gpu ops: an op it does not know
is an error naming it (add a case to ``_compile_op``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mlir.ir import (
    Block,
    Context,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    MemRefType,
    Module,
    Operation,
    Value,
    VectorType,
)

from mlir_nn.runtime.plan import ITEMSIZE, BoundPlan, Copy, Launch, bind

DYNAMIC = -9223372036854775808  # kDynamic in static_offsets/sizes/strides
NUMPY_TYPES = {"index": np.int64, "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
               "i1": np.bool_, "f32": np.float32, "f64": np.float64, "f16": np.float16}
DIMS = {"x": 0, "y": 1, "z": 2}


class SimtError(RuntimeError):
    """The kernel cannot be interpreted (an op or a form this interpreter does not know)."""


@dataclass
class Report:
    """What one or more launches did wrong (empty lists: nothing)."""

    kernels: int = 0
    races: list[str] = field(default_factory=list)
    out_of_bounds: list[str] = field(default_factory=list)
    divergent_barriers: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.races or self.out_of_bounds or self.divergent_barriers)


@dataclass
class Buffer:
    """Bytes of one global buffer, or of one workgroup attribution for every block (``per_block`` bytes each)."""

    name: str
    data: np.ndarray  # uint8
    per_block: int = 0  # shared memory: bytes per block; 0 for global memory

    def typed(self, dtype: Any) -> np.ndarray:
        return self.data.view(dtype)


@dataclass
class MemRef:
    """A strided view of a buffer; offset, sizes and strides are ints or per-lane arrays (in elements)."""

    buffer: Buffer
    dtype: Any
    offset: Any
    sizes: list[Any]
    strides: list[Any]


class Owners:
    """Per address of a buffer, who read it and who wrote it: an owner (thread or block), -1 none, -2 several."""

    def __init__(self, size: int) -> None:
        self.read = np.full(size, -1, np.int64)
        self.write = np.full(size, -1, np.int64)
        self.touched: list[np.ndarray] = []
        self.written = False

    def add(self, addresses: np.ndarray, owners: np.ndarray, write: bool) -> None:
        table = self.write if write else self.read
        self.written |= write
        before = table[addresses]
        table[addresses] = owners  # with repeated addresses the last owner wins ...
        several = (before == -2) | ((before >= 0) & (before != owners)) | (table[addresses] != owners)
        table[addresses[several]] = -2  # ... so any other owner of the same address marks it
        self.touched.append(addresses)

    def conflicts(self) -> np.ndarray:
        """Addresses written by one owner and read or written by another."""
        if not self.written:
            return np.empty(0, np.int64)
        addresses = np.concatenate(self.touched)
        w, r = self.write[addresses], self.read[addresses]
        return np.unique(addresses[(w == -2) | ((w >= 0) & (r != -1) & (r != w))])

    def clear(self) -> None:
        for addresses in self.touched:
            self.read[addresses] = -1
            self.write[addresses] = -1
        self.touched = []
        self.written = False


class Launched:
    """State of one launch: lane geometry, access logs, the report."""

    def __init__(self, kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int], report: Report) -> None:
        self.kernel, self.grid, self.block, self.report = kernel, grid, block, report
        self.threads = block[0] * block[1] * block[2]
        self.blocks = grid[0] * grid[1] * grid[2]
        lanes = np.arange(self.blocks * self.threads, dtype=np.int64)
        self.lanes = lanes
        self.block_of = lanes // self.threads
        t = lanes % self.threads
        b = self.block_of
        self.thread_id = (t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1]))
        self.block_id = (b % grid[0], (b // grid[0]) % grid[1], b // (grid[0] * grid[1]))
        self.by_thread: dict[str, tuple[Buffer, Owners]] = {}  # since the last barrier
        self.by_block: dict[str, Owners] = {}  # global memory, the whole launch
        self.barriers = 0
        self.in_flight: list[AsyncCopy] = []  # issued async copies not yet waited for
        self.pending: dict[str, np.ndarray] = {}  # per buffer element: in-flight copies writing it
        self.groups = np.zeros(len(lanes), np.int64)  # per lane: async groups committed so far

    def log(self, buffer: Buffer, addresses: np.ndarray, lanes: np.ndarray, write: bool, where: str = "") -> None:
        size = buffer.data.size
        pending = self.pending.get(buffer.name)
        if pending is not None and len(addresses) and (pending[addresses] > 0).any():
            self.report.races.append(
                f"{where or self.kernel}: {int((pending[addresses] > 0).sum())} accesses to {buffer.name} that an "
                "async copy is still writing (its thread has not waited for its group)")
        if buffer.name not in self.by_thread:
            self.by_thread[buffer.name] = (buffer, Owners(size))
        self.by_thread[buffer.name][1].add(addresses, lanes, write)
        if not buffer.per_block:
            self.by_block.setdefault(buffer.name, Owners(size)).add(addresses, self.block_of[lanes], write)

    def end_epoch(self, where: str) -> None:
        for name, (buffer, owners) in self.by_thread.items():
            bad = owners.conflicts()
            if len(bad):
                space = "shared" if buffer.per_block else "global"
                self.report.races.append(f"{self.kernel}: {len(bad)} {space} addresses of {name} raced {where} "
                                         "(two threads, one writing, no barrier between)")
            owners.clear()

    def complete(self, copy: AsyncCopy, done: np.ndarray) -> None:
        """Land the copies of ``copy``'s lanes where ``done``: shared memory gets their values now."""
        if not done.any():
            return
        addresses, values = copy.addresses[done], copy.values[done]
        flat = addresses.reshape(-1)
        np.subtract.at(self.pending[copy.buffer.name], flat, 1)
        copy.buffer.typed(copy.dtype)[flat] = values.reshape(-1)
        self.log(copy.buffer, flat, np.repeat(copy.lanes[done], addresses.shape[1]), True)
        keep = ~done
        copy.lanes, copy.addresses, copy.values, copy.group = (copy.lanes[keep], copy.addresses[keep],
                                                               copy.values[keep], copy.group[keep])

    def finish(self) -> None:
        left = sum(len(c.lanes) for c in self.in_flight)
        if left:
            self.report.races.append(f"{self.kernel}: {left} async copies never waited for before the end")
        self.end_epoch("before the end of the kernel")
        for name, owners in self.by_block.items():
            bad = owners.conflicts()
            if len(bad):
                self.report.races.append(f"{self.kernel}: {len(bad)} global addresses of {name} touched by two "
                                         "blocks, one writing")


@dataclass
class AsyncCopy:
    """The copies of one ``device_async_copy`` still in flight: per lane its destination and data."""

    buffer: Buffer
    dtype: Any
    lanes: np.ndarray  # (copies,)
    addresses: np.ndarray  # (copies, elements) destination element addresses
    values: np.ndarray  # (copies, elements) what lands there (zeros past srcElements)
    group: np.ndarray  # (copies,) the lane's group number, -1 while not committed


# ---------------------------------------------------------------------------- values

def _lanes(v: Any, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(v), (n,))


def _where(mask: np.ndarray, new: Any, old: Any) -> Any:
    """Per lane ``new`` where ``mask`` else ``old``; vector values (lanes x elements) follow their lane."""
    extra = max(np.ndim(new), np.ndim(old)) - 1
    return np.where(mask.reshape(mask.shape + (1,) * extra) if extra > 0 else mask, new, old)


def _np_type(t: Any) -> Any:
    name = str(t)
    if name not in NUMPY_TYPES:
        raise SimtError(f"simt: values of type {name} are not supported")
    return NUMPY_TYPES[name]


def _tdiv(a: Any, b: Any) -> Any:
    """Integer division rounding toward zero (divsi); a zero divisor (masked lanes) gives 0."""
    b = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(b)
    return np.where((np.asarray(a) < 0) != (np.asarray(b) < 0), -q, q)


def _ceildiv(a: Any, b: Any) -> Any:
    q = _tdiv(a, b)
    return q + ((q * b != a) & ((np.asarray(a) > 0) == (np.asarray(b) > 0)))


def _unsigned(v: Any) -> Any:
    return np.asarray(v).astype(np.uint64)


CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater, 5: np.greater_equal,
        6: lambda a, b: _unsigned(a) < _unsigned(b), 7: lambda a, b: _unsigned(a) <= _unsigned(b),
        8: lambda a, b: _unsigned(a) > _unsigned(b), 9: lambda a, b: _unsigned(a) >= _unsigned(b)}


def _cmpf(pred: int, a: Any, b: Any) -> Any:
    unordered = np.isnan(a) | np.isnan(b)
    base = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal, 6: np.not_equal}
    if pred == 0:
        return np.zeros_like(unordered)
    if pred == 15:
        return np.ones_like(unordered)
    if pred == 7:
        return ~unordered
    if pred == 14:
        return unordered
    if pred <= 6:
        return base[pred](a, b) & ~unordered
    return base[pred - 7](a, b) | unordered


BINARY = {
    "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply, "arith.divf": np.divide,
    "arith.divsi": _tdiv, "arith.divui": _tdiv, "arith.ceildivsi": _ceildiv, "arith.ceildivui": _ceildiv,
    "arith.floordivsi": lambda a, b: np.floor_divide(a, np.where(b == 0, 1, b)),
    "arith.remsi": lambda a, b: a - _tdiv(a, b) * b, "arith.remui": lambda a, b: a - _tdiv(a, b) * b,
    "arith.minsi": np.minimum, "arith.maxsi": np.maximum, "arith.minui": np.minimum, "arith.maxui": np.maximum,
    "arith.maximumf": np.maximum, "arith.minimumf": np.minimum, "arith.maxnumf": np.fmax, "arith.minnumf": np.fmin,
    "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
    "arith.remf": np.fmod, "math.powf": np.power, "math.atan2": np.arctan2, "math.copysign": np.copysign,
}
UNARY = {
    "arith.negf": np.negative, "math.exp": np.exp, "math.log": np.log, "math.tanh": np.tanh, "math.sqrt": np.sqrt,
    "math.rsqrt": lambda x: 1 / np.sqrt(x), "math.absf": np.abs, "math.log1p": np.log1p, "math.expm1": np.expm1,
    "math.sin": np.sin, "math.cos": np.cos, "math.floor": np.floor, "math.ceil": np.ceil, "math.exp2": np.exp2,
    "math.log2": np.log2,
    "math.erf": lambda x: np.frompyfunc(math.erf, 1, 1)(x).astype(np.asarray(x).dtype),  # libm's, as on the host
}
CASTS = ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci", "arith.sitofp",
         "arith.uitofp", "arith.extf", "arith.truncf", "arith.fptosi", "arith.fptoui")


# ---------------------------------------------------------------------------- compiling a kernel

Step = Callable[[list, Any, Launched], None]  # (slots, mask, launch)


@dataclass
class Region:
    steps: list[Step]
    args: list[int]  # slots of the block arguments
    yields: list[int]  # slots the terminator yields


class Kernel:
    """One gpu.func compiled to Python closures over a slot array (one slot per SSA value)."""

    def __init__(self, func: Operation) -> None:
        self.name = func.attributes["sym_name"].value
        self.slots: dict[Value, int] = {}
        block = func.regions[0].blocks[0]
        n_workgroup = IntegerAttr(func.attributes["workgroup_attributions"]).value \
            if "workgroup_attributions" in func.attributes else 0
        args = list(block.arguments)
        self.n_args = len(args) - n_workgroup
        self.arg_types = [a.type for a in args[:self.n_args]]
        self.workgroup = [(self._slot(a), MemRefType(a.type)) for a in args[self.n_args:]]
        self.body = self._region(block)

    def _slot(self, v: Value) -> int:
        if v not in self.slots:
            self.slots[v] = len(self.slots)
        return self.slots[v]

    def _region(self, block: Block) -> Region:
        args = [self._slot(a) for a in block.arguments]
        steps: list[Step] = []
        yields: list[int] = []
        for op in block.operations:
            op = op.operation
            if op.name in ("scf.yield", "gpu.return"):
                yields = [self._slot(v) for v in op.operands]
                continue
            steps.append(self._compile_op(op))
        return Region(steps, args, yields)

    def _compile_op(self, op: Operation) -> Step:
        name = op.name
        ins = [self._slot(v) for v in op.operands]
        outs = [self._slot(r) for r in op.results]
        where = f"{self.name}: {name}"
        if name == "arith.constant":
            value = _constant(op)

            def constant(s, mask, run): s[outs[0]] = value
            return constant
        if name in BINARY:
            fn = BINARY[name]
            rtype = _np_type(op.results[0].type)

            def binary(s, mask, run):
                with np.errstate(all="ignore"):
                    s[outs[0]] = np.asarray(fn(s[ins[0]], s[ins[1]])).astype(rtype, copy=False)
            return binary
        if name in UNARY:
            fn = UNARY[name]

            def unary(s, mask, run):
                with np.errstate(all="ignore"):
                    s[outs[0]] = fn(s[ins[0]])
            return unary
        if name == "math.fma":
            def fma(s, mask, run):
                a, b, c = (s[i] for i in ins)
                exact = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
                s[outs[0]] = exact.astype(np.asarray(a).dtype)
            return fma
        if name in CASTS:
            rtype = _np_type(op.results[0].type)

            def cast(s, mask, run):
                with np.errstate(all="ignore"):
                    s[outs[0]] = np.asarray(s[ins[0]]).astype(rtype)
            return cast
        if name == "arith.cmpi":
            cmp = CMPI[IntegerAttr(op.attributes["predicate"]).value]

            def cmpi(s, mask, run): s[outs[0]] = cmp(s[ins[0]], s[ins[1]])
            return cmpi
        if name == "arith.cmpf":
            pred = IntegerAttr(op.attributes["predicate"]).value

            def cmpf(s, mask, run): s[outs[0]] = _cmpf(pred, s[ins[0]], s[ins[1]])
            return cmpf
        if name == "arith.select":
            def select(s, mask, run): s[outs[0]] = np.where(s[ins[0]], s[ins[1]], s[ins[2]])
            return select
        if name in ("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim"):
            return self._gpu_index(name, DIMS[str(op.attributes["dimension"])[-2]], outs[0])
        if name == "gpu.barrier":
            return self._barrier(where)
        if name == "memref.load":
            return self._load(op, ins, outs, where)
        if name == "memref.store":
            return self._store(op, ins, where)
        if name == "vector.load":
            return self._vector_load(op, ins, outs, where)
        if name == "nvgpu.device_async_copy":
            return self._async_copy(op, ins, outs, where)
        if name == "nvgpu.device_async_create_group":
            return self._async_commit(outs)
        if name == "nvgpu.device_async_wait":
            keep = IntegerAttr(op.attributes["numGroups"]).value if "numGroups" in op.attributes else 0
            return self._async_wait(keep)
        if name == "vector.extract":
            position = list(op.attributes["static_position"])
            if len(position) != 1 or len(ins) != 1:
                raise SimtError(f"simt: {where}: only a static position into a 1-d vector is supported")

            def extract(s, mask, run): s[outs[0]] = np.asarray(s[ins[0]])[..., position[0]]
            return extract
        if name == "memref.subview":
            return self._subview(op, ins, outs)
        if name == "memref.view":
            return self._view(op, ins, outs, where)
        if name == "memref.dim":
            def dim(s, mask, run): s[outs[0]] = s[ins[0]].sizes[int(s[ins[1]])]
            return dim
        if name == "memref.cast":
            def same(s, mask, run): s[outs[0]] = s[ins[0]]
            return same
        if name == "scf.for":
            return self._for(op, ins, outs)
        if name == "scf.if":
            return self._if(op, ins, outs)
        raise SimtError(f"simt: {where} is not supported by the interpreter")

    # ------------------------------------------------------------------ ops with structure

    @staticmethod
    def _gpu_index(name: str, axis: int, out: int) -> Step:
        def index(s, mask, run):
            if name == "gpu.thread_id":
                s[out] = run.thread_id[axis]
            elif name == "gpu.block_id":
                s[out] = run.block_id[axis]
            else:
                s[out] = np.int64((run.block if name == "gpu.block_dim" else run.grid)[axis])
        return index

    @staticmethod
    def _barrier(where: str) -> Step:
        def barrier(s, mask, run):
            run.barriers += 1
            if mask is not None:
                per_block = mask.reshape(run.blocks, run.threads)
                some = per_block.any(axis=1) & ~per_block.all(axis=1)
                if some.any():
                    run.report.divergent_barriers.append(
                        f"{where} reached by only some threads of {int(some.sum())} blocks")
            run.end_epoch(f"before barrier {run.barriers}")
        return barrier

    def _addresses(self, m: MemRef, idx: list[Any], mask: Any, run: Launched, where: str) -> tuple:
        """Element addresses and lanes of the active lanes; OOB lanes are reported and dropped."""
        n = len(run.lanes)
        active = np.ones(n, bool) if mask is None else mask
        address = _lanes(m.offset, n).astype(np.int64)
        inside = active.copy()
        for i, size, stride in zip(idx, m.sizes, m.strides):
            i = _lanes(i, n)
            inside &= (i >= 0) & (i < _lanes(size, n))
            address = address + i * _lanes(stride, n)
        length = m.buffer.data.size // np.dtype(m.dtype).itemsize
        inside &= (address >= 0) & (address < length)
        bad = active & ~inside
        if bad.any():
            lane = int(np.flatnonzero(bad)[0])
            tid = tuple(int(t[lane]) for t in run.thread_id)
            bid = tuple(int(b[lane]) for b in run.block_id)
            run.report.out_of_bounds.append(f"{where} out of bounds of {m.buffer.name} in {int(bad.sum())} threads "
                                            f"(first: block {bid}, thread {tid}, index "
                                            f"{[int(_lanes(i, n)[lane]) for i in idx]}, sizes "
                                            f"{[int(_lanes(z, n)[lane]) for z in m.sizes]})")
        lanes = np.flatnonzero(inside)
        return address[lanes], lanes

    def _load(self, op: Operation, ins: list[int], outs: list[int], where: str) -> Step:
        rtype = _np_type(op.results[0].type)

        def load(s, mask, run):
            m = s[ins[0]]
            address, lanes = self._addresses(m, [s[i] for i in ins[1:]], mask, run, where)
            run.log(m.buffer, address, lanes, False, where)
            out = np.zeros(len(run.lanes), rtype)
            out[lanes] = m.buffer.typed(m.dtype)[address]
            s[outs[0]] = out
        return load

    def _store(self, op: Operation, ins: list[int], where: str) -> Step:
        def store(s, mask, run):
            m = s[ins[1]]
            address, lanes = self._addresses(m, [s[i] for i in ins[2:]], mask, run, where)
            run.log(m.buffer, address, lanes, True, where)
            m.buffer.typed(m.dtype)[address] = _lanes(s[ins[0]], len(run.lanes))[lanes]
        return store

    def _vector_load(self, op: Operation, ins: list[int], outs: list[int], where: str) -> Step:
        """``width`` consecutive elements along the last index; the device needs them aligned to the vector."""
        vtype = VectorType(op.results[0].type)
        if vtype.rank != 1:
            raise SimtError(f"simt: {where}: only 1-d vectors are supported")
        width, rtype = vtype.shape[0], _np_type(vtype.element_type)

        def load(s, mask, run):
            m = s[ins[0]]
            idx = [s[i] for i in ins[1:]]
            out = np.zeros((len(run.lanes), width), rtype)
            for e in range(width):
                address, lanes = self._addresses(m, idx[:-1] + [idx[-1] + e], mask, run, where)
                if e == 0 and np.any(address % width):
                    run.report.out_of_bounds.append(f"{where}: {int(np.sum(address % width != 0))} threads load a "
                                                    f"vector of {width} from an address not aligned to it")
                run.log(m.buffer, address, lanes, False, where)
                out[lanes, e] = m.buffer.typed(m.dtype)[address]
            s[outs[0]] = out
        return load

    def _async_copy(self, op: Operation, ins: list[int], outs: list[int], where: str) -> Step:
        """Read the source now (its first ``srcElements``), keep the data in flight until the wait."""
        sizes = list(op.attributes["operandSegmentSizes"])  # dst, dstIndices, src, srcIndices, srcElements
        dst, dst_idx = ins[0], ins[1:1 + sizes[1]]
        src, src_idx = ins[1 + sizes[1]], ins[2 + sizes[1]:2 + sizes[1] + sizes[3]]
        count = ins[-1] if sizes[4] else None
        width = IntegerAttr(op.attributes["dstElements"]).value

        def misaligned(address: np.ndarray, what: str, run: Launched) -> None:
            if np.any(address % width):
                run.report.out_of_bounds.append(f"{where}: {int(np.sum(address % width != 0))} threads copy "
                                                f"{width} elements {what} an address not aligned to them")

        def copy(s, mask, run):
            d, m = s[dst], s[src]
            n = len(run.lanes)
            active = np.ones(n, bool) if mask is None else mask
            valid = _lanes(width if count is None else s[count], n)
            values = np.zeros((n, width), m.dtype)
            targets = []
            for e in range(width):
                index = [s[i] for i in src_idx]
                address, lanes = self._addresses(m, index[:-1] + [index[-1] + e], active & (valid > e), run, where)
                if e == 0:
                    misaligned(address, "from", run)
                run.log(m.buffer, address, lanes, False, where)
                values[lanes, e] = m.buffer.typed(m.dtype)[address]
                index = [s[i] for i in dst_idx]
                target, lanes = self._addresses(d, index[:-1] + [index[-1] + e], active, run, where)
                if e == 0:
                    misaligned(target, "to", run)
                    copying = lanes
                elif not np.array_equal(lanes, copying):
                    raise SimtError(f"simt: {where}: an async copy runs past its destination")
                targets.append(target)
            s[outs[0]] = None  # the token: groups are tracked per thread
            if not len(copying):
                return
            addresses = np.stack(targets, axis=1)
            run.log(d.buffer, addresses.reshape(-1), np.repeat(copying, width), True, where)
            pending = run.pending.setdefault(d.buffer.name, np.zeros(d.buffer.data.size, np.int32))
            np.add.at(pending, addresses.reshape(-1), 1)
            run.in_flight.append(AsyncCopy(d.buffer, d.dtype, copying, addresses, values[copying],
                                           np.full(len(copying), -1, np.int64)))
        return copy

    @staticmethod
    def _async_commit(outs: list[int]) -> Step:
        def commit(s, mask, run):
            active = np.ones(len(run.lanes), bool) if mask is None else mask
            for c in run.in_flight:
                new = (c.group < 0) & active[c.lanes]
                c.group[new] = run.groups[c.lanes[new]]
            run.groups[active] += 1
            s[outs[0]] = None
        return commit

    @staticmethod
    def _async_wait(keep: int) -> Step:
        def wait(s, mask, run):
            active = np.ones(len(run.lanes), bool) if mask is None else mask
            for c in run.in_flight:
                run.complete(c, active[c.lanes] & (c.group >= 0) & (c.group < run.groups[c.lanes] - keep))
            run.in_flight = [c for c in run.in_flight if len(c.lanes)]
        return wait

    @staticmethod
    def _subview(op: Operation, ins: list[int], outs: list[int]) -> Step:
        static = [list(op.attributes[k]) for k in ("static_offsets", "static_sizes", "static_strides")]
        result_rank = MemRefType(op.results[0].type).rank

        def subview(s, mask, run):
            src: MemRef = s[ins[0]]
            dynamic = iter(s[i] for i in ins[1:])
            offsets, sizes, strides = ([next(dynamic) if v == DYNAMIC else v for v in part] for part in static)
            offset = src.offset
            for o, stride in zip(offsets, src.strides):
                offset = offset + o * stride
            new_strides = [a * b for a, b in zip(src.strides, strides)]
            keep = list(range(len(sizes)))
            if result_rank < len(sizes):  # rank-reducing: drop unit dims, outermost first
                unit = [d for d in keep if static[1][d] == 1]
                keep = [d for d in keep if d not in unit[:len(sizes) - result_rank]]
            s[outs[0]] = MemRef(src.buffer, src.dtype, offset, [sizes[d] for d in keep], [new_strides[d] for d in keep])
        return subview

    @staticmethod
    def _view(op: Operation, ins: list[int], outs: list[int], where: str) -> Step:
        rtype = MemRefType(op.results[0].type)
        dtype = _np_type(rtype.element_type)
        itemsize = np.dtype(dtype).itemsize

        def view(s, mask, run):
            src: MemRef = s[ins[0]]
            dynamic = iter(s[i] for i in ins[2:])
            shape = [next(dynamic) if rtype.is_dynamic_dim(d) else rtype.shape[d] for d in range(rtype.rank)]
            byte_offset = np.asarray(src.offset + s[ins[1]])
            if np.any(byte_offset % itemsize):
                raise SimtError(f"simt: {where}: byte shift not a multiple of {itemsize}")
            strides, step = [], 1
            for d in reversed(shape):
                strides.insert(0, step)
                step = step * d
            s[outs[0]] = MemRef(src.buffer, dtype, byte_offset // itemsize, shape, strides)
        return view

    def _for(self, op: Operation, ins: list[int], outs: list[int]) -> Step:
        body = self._region(op.regions[0].blocks[0])
        lo, hi, st, inits = ins[0], ins[1], ins[2], ins[3:]
        iv, carried = body.args[0], body.args[1:]

        def loop(s, mask, run):
            for c, i in zip(carried, inits):
                s[c] = s[i]
            start, stop, step = s[lo], s[hi], s[st]
            if all(np.ndim(v) == 0 for v in (start, stop, step)):
                for i in range(int(start), int(stop), int(step)):
                    s[iv] = np.int64(i)
                    _run(body, s, mask, run)
                    for c, y in zip(carried, body.yields):
                        s[c] = s[y]
            else:  # trip count differs between lanes: mask the lanes that are done
                i = _lanes(start, len(run.lanes)).astype(np.int64)
                while True:
                    active = i < stop if mask is None else mask & (i < stop)
                    if not active.any():
                        break
                    s[iv] = i
                    _run(body, s, active, run)
                    for c, y in zip(carried, body.yields):
                        s[c] = _where(active, s[y], s[c])
                    i = i + step
            for o, c in zip(outs, carried):
                s[o] = s[c]
        return loop

    def _if(self, op: Operation, ins: list[int], outs: list[int]) -> Step:
        then = self._region(op.regions[0].blocks[0])
        other = self._region(op.regions[1].blocks[0]) if len(op.regions[1].blocks) else None

        def branch(s, mask, run):
            cond = s[ins[0]]
            if np.ndim(cond) == 0:
                chosen = then if cond else other
                if chosen is not None:
                    _run(chosen, s, mask, run)
                    for o, y in zip(outs, chosen.yields):
                        s[o] = s[y]
                return
            on = cond if mask is None else mask & cond
            off = ~cond if mask is None else mask & ~cond
            _run(then, s, on, run)
            results = [s[y] for y in then.yields]
            if other is not None:
                _run(other, s, off, run)
                results = [_where(cond, a, s[y]) for a, y in zip(results, other.yields)]
            for o, v in zip(outs, results):
                s[o] = v
        return branch

    def launch(self, args: list[Any], grid: tuple[int, int, int], block: tuple[int, int, int],
               report: Report) -> None:
        """Run the kernel on ``args`` (MemRef or scalar per gpu.func argument) for one launch."""
        run = Launched(self.name, grid, block, report)
        s: list[Any] = [None] * len(self.slots)
        for slot, a in zip(self.body.args, args):
            s[slot] = a
        for slot, mtype in self.workgroup:
            nbytes = _nbytes(mtype)
            buf = Buffer(f"{self.name} shared memory {slot}", np.full(run.blocks * nbytes, 0xFF, np.uint8), nbytes)
            itemsize = np.dtype(_np_type(mtype.element_type)).itemsize
            strides, step = [], 1
            for d in reversed(mtype.shape):
                strides.insert(0, step)
                step *= d
            s[slot] = MemRef(buf, _np_type(mtype.element_type), run.block_of * (nbytes // itemsize),
                             list(mtype.shape), strides)
        _run(self.body, s, None, run)
        run.finish()
        report.kernels += 1


def _run(region: Region, s: list, mask: Any, run: Launched) -> None:
    if mask is not None and not mask.any():
        return
    for step in region.steps:
        step(s, mask, run)


def _constant(op: Operation) -> Any:
    attr = op.attributes["value"]
    if isinstance(op.results[0].type, VectorType):  # a splat, as one lane's row (lanes x elements broadcasts)
        vtype = VectorType(op.results[0].type)
        if vtype.rank != 1 or not isinstance(attr, DenseElementsAttr) or not attr.is_splat:
            raise SimtError(f"simt: vector constant {attr} is not a 1-d splat")
        value = _constant_value(attr.get_splat_value(), _np_type(vtype.element_type))
        return np.full((1, vtype.shape[0]), value)
    return _constant_value(attr, _np_type(op.results[0].type))


def _constant_value(attr: Any, dtype: Any) -> Any:
    if isinstance(attr, (IntegerAttr, FloatAttr)):
        return dtype(attr.value)
    raise SimtError(f"simt: constant {attr} is not a scalar")


def _nbytes(t: MemRefType) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n * np.dtype(_np_type(t.element_type)).itemsize


# ---------------------------------------------------------------------------- running a step

class SimtProgram:
    """The kernels of a compiled step (its ``gpu`` text) with its launch plan."""

    def __init__(self, gpu_text: str, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.context = Context()
        with self.context:
            module = Module.parse(gpu_text)
            self.kernels: dict[tuple[str, str], Kernel] = {}
            for op in module.body.operations:
                op = op.operation
                if op.name != "gpu.module":
                    continue
                for f in op.regions[0].blocks[0].operations:
                    if f.operation.name == "gpu.func":
                        kernel = Kernel(f.operation)
                        self.kernels[(op.attributes["sym_name"].value, kernel.name)] = kernel

    def run(self, args: list[np.ndarray]) -> tuple[list[np.ndarray], Report]:
        """Run the plan on ``args`` (inputs then parameters, untouched); returns the results and the report."""
        report = Report()
        bound: BoundPlan = bind(self.plan, [tuple(a.shape) for a in args])
        memory = {view.buffer: Buffer(view.buffer, np.frombuffer(np.ascontiguousarray(a).tobytes(), np.uint8).copy())
                  for view, a in zip(bound.args, args)}
        for name, nbytes in bound.allocs.items():  # fresh allocations hold NaN: reading one before writing shows
            memory[name] = Buffer(name, np.full(nbytes, 0xFF, np.uint8))
        for launch in bound.actions:
            if isinstance(launch, Copy):
                _view_array(memory, launch.dst)[...] = _view_array(memory, launch.src)
                continue
            kernel = self.kernels[(launch.binary, launch.kernel)]
            kernel.launch(_kernel_args(kernel, launch, memory), launch.grid, launch.block, report)
        return [_view_array(memory, v).copy() for v in bound.results], report


def _view_array(memory: dict[str, Buffer], view: Any) -> np.ndarray:
    itemsize = ITEMSIZE[view.dtype]
    count = int(np.prod(view.shape, dtype=np.int64))
    flat = memory[view.buffer].typed(view.dtype)
    if (view.offset + count) * itemsize > memory[view.buffer].data.size:
        raise SimtError(f"simt: view of {view.buffer} at {view.offset} with shape {view.shape} overruns it")
    return flat[view.offset:view.offset + count].reshape(view.shape)


def _kernel_args(kernel: Kernel, launch: Launch, memory: dict[str, Buffer]) -> list[Any]:
    """The packed launch parameters (the ABI of convert-gpu-to-nvvm) back to one value per gpu.func argument."""
    params = list(launch.params)
    out: list[Any] = []
    for t in kernel.arg_types:
        if isinstance(t, MemRefType) or str(t).startswith("memref"):
            mt = MemRefType(t)
            need = 3 + 2 * mt.rank
            if len(params) < need or params[0][0] != "ptr":
                raise SimtError(f"simt: {launch.kernel}: launch parameters do not match argument {t}")
            part, params = params[:need], params[need:]
            sizes = [v for _, v in part[3:3 + mt.rank]]
            strides = [v for _, v in part[3 + mt.rank:]]
            for d in range(mt.rank):
                if not mt.is_dynamic_dim(d) and mt.shape[d] != sizes[d]:
                    raise SimtError(f"simt: {launch.kernel}: argument {t} launched with sizes {sizes}")
            out.append(MemRef(memory[part[0][1]], _np_type(mt.element_type), part[2][1], sizes, strides))
        else:
            if not params:
                raise SimtError(f"simt: {launch.kernel}: too few launch parameters")
            (_, value), params = params[0], params[1:]
            out.append(_np_type(t)(value))
    if params:
        raise SimtError(f"simt: {launch.kernel}: {len(params)} launch parameters left over")
    return out
