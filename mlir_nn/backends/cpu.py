"""The compiled CPU backend: Graph -> linalg -> LLVM dialect -> native code, called in place.

``compile_kernel`` turns a graph into native code once per (graph, pipeline, target,
version) and caches it in memory and on disk. ``CpuExecutable.run`` checks the
arguments in Python, binds them to prebuilt memref descriptors and makes one native
call; parameters are updated in their own numpy buffers.

Native calling convention (after ``passes/cpu.pipeline``): arguments are the graph's
inputs, then its params, then one caller-allocated buffer per output.

Threads: the row blocks of large matrix products run on MLIR's async runtime thread pool
(``mlir_nn.codegen.cpu_matmul``). A fork copies only the calling thread, so a process
forked after that pool started must not call such a kernel (it would wait forever for
threads that do not exist there): it compiles and calls a build without threads instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import numpy as np

from mlir_nn.backends.base import check_arguments
from mlir_nn.backends.compile_cache import cache_key, read_entry, write_entry
from mlir_nn.backends.cpu_target import register_block
from mlir_nn.backends.lowering import check_lowered_to_llvm, run_pipeline
from mlir_nn.backends.memref_args import ArgumentBlock
from mlir_nn.backends.native import OPT_LEVEL, NativeError, NativeFunction, jit, link_shared_object, load_shared_object
from mlir_nn.ir import BATCH, Graph
from mlir_nn.ir.shapes import resolve
from mlir_nn.pipelines import Pipeline, load_pipeline, shipped_dir

TARGET = "cpu"


@dataclass
class Kernel:
    """Native code for one graph: the entry point, stage texts and where it came from."""

    native: NativeFunction
    stages: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    source: str = "compiled"  # "compiled", "disk" or "memory"
    pipeline: Pipeline | None = None  # what it was lowered with

    @property
    def threaded(self) -> bool:
        """True when some of its products run on the async runtime's threads."""
        return PARALLEL_FN in self.stages.get("llvm", "")


_MEMORY: dict[str, Kernel] = {}
_BACKEND_SOURCES = ("cpu.py", "cpu_target.py", "lowering.py", "native.py")
SCHEDULE = "cpu_matmul.mlir"  # the transform schedule mlir_nn.codegen.cpu_matmul applies
PARALLEL_FN = "parallel_compute_fn"  # a parallel loop body outlined by the async-parallel-for pass
THREAD_PASS = "async-parallel-for"


def _version() -> str:
    from mlir_nn import __version__

    return __version__


@cache
def codegen_digest() -> str:
    """sha256 of what turns a graph into machine code besides the pipeline text: the
    sources of the code generator and of this backend, the matmul schedule, and the host's
    register block. Part of the cache key, so no entry survives a code-generator change."""
    package = Path(__file__).resolve().parent.parent
    sources = sorted((package / "codegen").glob("*.py")) + [package / "backends" / n for n in _BACKEND_SOURCES]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update((shipped_dir() / SCHEDULE).read_bytes())
    digest.update(repr(register_block(4) + register_block(8)).encode())
    return digest.hexdigest()


def lower(graph: Graph, pipeline: Pipeline, threads: bool = True) -> tuple[object, dict[str, str], dict[str, float]]:
    """Emit linalg, make updates in place and run ``pipeline``: (LLVM module, stages, timings).
    Large products use threads when ``threads`` is set and the pipeline has the async passes."""
    from mlir_nn.codegen import emit_linalg, symbol_name
    from mlir_nn.codegen.copies import strided_copies_as_loops
    from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
    from mlir_nn.codegen.fp_env import flush_subnormals
    from mlir_nn.codegen.inplace import copy_repeated_results, write_updates_in_place

    timings: dict[str, float] = {}
    start = time.perf_counter()
    module = emit_linalg(graph)
    stages = {"linalg": str(module)}
    slot = {p.attr("name"): len(graph.inputs) + i for i, p in enumerate(graph.params)}
    fn = module.body.operations[0]
    write_updates_in_place(module, fn, len(graph.outputs), [slot[name] for name, _ in graph.updates])
    rewrite_matmuls(module, threads and any(p.startswith(THREAD_PASS) for p in pipeline.passes))
    timings["codegen"] = time.perf_counter() - start
    start = time.perf_counter()
    hooks = {"buffer-results-to-out-params": copy_repeated_results,
             "convert-bufferization-to-memref": lambda m: flush_subnormals(m, symbol_name(graph)),
             "convert-linalg-to-loops": strided_copies_as_loops}
    run_pipeline(module, pipeline, hooks)
    timings["passes"] = time.perf_counter() - start
    stages["llvm"] = str(module)
    return module, stages, timings


def compile_kernel(graph: Graph, pipeline: Pipeline | None = None, use_disk: bool = True,
                   threads: bool = True) -> Kernel:
    """Native code for ``graph`` from the memory cache, the disk cache, or a fresh compile.
    ``threads=False`` builds every product to run on the calling thread."""
    from mlir_nn.codegen import symbol_name

    pipeline = pipeline or load_pipeline(TARGET)
    target = TARGET if threads else f"{TARGET}-serial"
    key = cache_key(graph.fingerprint(), pipeline.text, target, f"{_version()}+{codegen_digest()}", OPT_LEVEL)
    if key in _MEMORY:
        return replace(_MEMORY[key], timings={}, source="memory")
    name = symbol_name(graph)
    if use_disk:
        start = time.perf_counter()
        entry = read_entry(key)
        if entry is not None and entry.meta.get("symbol") == name:
            try:
                native = load_shared_object(entry.library, name)
            except NativeError:
                native = None
            if native is not None:
                kernel = Kernel(native, entry.stages, {"load": time.perf_counter() - start}, "disk", pipeline)
                _MEMORY[key] = kernel
                return kernel
    module, stages, timings = lower(graph, pipeline, threads)
    check_lowered_to_llvm(module, pipeline)
    start = time.perf_counter()
    native, engine = jit(module, name)
    timings["llvm"] = time.perf_counter() - start
    if use_disk:
        start = time.perf_counter()
        _store(key, engine, name, stages)
        timings["cache-write"] = time.perf_counter() - start
    kernel = Kernel(native, stages, timings, "compiled", pipeline)
    _MEMORY[key] = kernel
    return kernel


def _store(key: str, engine: object, name: str, stages: dict[str, str]) -> None:
    """Write the disk-cache entry; a failure only costs the next process a recompile."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            library = Path(tmp) / "step.so"
            link_shared_object(engine, library)
            write_entry(key, library, {"symbol": name, "target": TARGET, "version": _version()}, stages)
    except (NativeError, OSError) as error:
        warnings.warn(f"mlir-nn: could not write the compile cache entry: {error}", RuntimeWarning, stacklevel=3)


def clear_memory_cache() -> None:
    """Forget the kernels compiled in this process (the disk cache stays)."""
    _MEMORY.clear()


_SUM = np.add.reduce
_threads_started = False  # a threaded kernel was called: the async runtime's threads exist
_threads_lost = False  # this process was forked after they started: here they do not


def _after_fork_in_child() -> None:
    global _threads_lost
    _threads_lost = _threads_lost or _threads_started


os.register_at_fork(after_in_child=_after_fork_in_child)


def _address(array: np.ndarray) -> int:
    """Data pointer of a C-contiguous array (the buffer protocol is ~5x faster than .ctypes)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):  # read-only or empty buffers
        return array.ctypes.data


class CpuExecutable:
    """A compiled step bound to prebuilt argument descriptors."""

    def __init__(self, graph: Graph, kernel: Kernel) -> None:
        self.graph = graph
        self.kernel = kernel
        self.stages = kernel.stages
        leaves = list(graph.inputs) + list(graph.params) + list(graph.outputs)
        self._args = ArgumentBlock([len(n.shape) for n in leaves])
        self._call = self._threaded_call if kernel.threaded else kernel.native.call
        self._n_inputs = len(graph.inputs)
        self._n_params = len(graph.params)
        self._bound: list[np.ndarray | None] = [None] * self._n_params
        self._outputs = [(n.shape, np.dtype(n.dtype), self._batch_major(n.shape)) for n in graph.outputs]
        self._input_fast = [self._batch_major(n.shape) for n in graph.inputs]
        self._input_specs = [(np.dtype(n.dtype), len(n.shape), tuple(n.shape[1:])) for n in graph.inputs]
        self._param_shapes = [tuple(n.shape) for n in graph.params]
        self._input_offsets = [self._args.offsets[i] for i in range(self._n_inputs)]
        out_offsets = self._args.offsets[self._n_inputs + self._n_params:]
        self._all_fast = all(self._input_fast) and all(
            fast or BATCH not in shape for shape, _, fast in self._outputs)
        # (descriptor offset, static shape, dtype, batch-major) per output, for the fast path
        self._output_slots = [(o, tuple(shape[1:]) if fast else tuple(shape), dtype, fast)
                              for o, (shape, dtype, fast) in zip(out_offsets, self._outputs)]
        for i, node in enumerate(leaves):
            if self._batch_major(node.shape):
                self._args.set_batch_major_layout(i, node.shape[1:])
            elif BATCH not in node.shape:
                self._args.set_static_layout(i, node.shape)

    def _threaded_call(self, address: int) -> None:
        """Call a kernel that uses the async runtime's threads; in a process forked after they
        started, switch to a build without threads (see the module docstring)."""
        global _threads_started
        if _threads_lost:
            self.kernel = compile_kernel(self.graph, self.kernel.pipeline, threads=False)
            self._call = self.kernel.native.call  # from now on, in this process
            self._call(address)
            return
        _threads_started = True
        self.kernel.native.call(address)

    @staticmethod
    def _batch_major(shape: tuple) -> bool:
        """True when only the leading dim is the batch (sizes change in one word, strides never)."""
        return bool(shape) and shape[0] == BATCH and BATCH not in shape[1:]

    def _bind_params(self, params: list[np.ndarray]) -> None:
        """(Re)bind parameters whose array object changed; they must not share memory."""
        changed = False
        for i, p in enumerate(params):
            bound = self._bound[i]
            if bound is p and p.flags.c_contiguous:  # shape and dtype were checked by check_arguments
                continue
            if not p.flags.c_contiguous:
                raise ValueError(f"{self.graph.name}: parameter {self.graph.params[i].attr('name')} is not "
                                 "C-contiguous; the cpu backend updates parameters in place in their own buffers")
            self._args.bind(self._n_inputs + i, p)
            self._bound[i] = p
            changed = True
        if changed:
            self._check_param_overlap(params)

    def _check_param_overlap(self, params: list[np.ndarray]) -> None:
        for i in range(len(params)):
            for j in range(i + 1, len(params)):
                if np.shares_memory(params[i], params[j]):
                    self._bound = [None] * self._n_params
                    a, b = (self.graph.params[k].attr("name") for k in (i, j))
                    raise ValueError(f"{self.graph.name}: parameters {a} and {b} share memory; "
                                     "the cpu backend updates parameters in place and needs separate buffers")

    def _quick_batch(self, inputs: Sequence[np.ndarray], params: list[np.ndarray]) -> int | None:
        """The batch size when the arguments are plainly valid: batch-major finite C-contiguous
        inputs that share no memory with a parameter, and the same parameter arrays as last
        call. None means "take the fully checked path"."""
        if not self._all_fast or len(inputs) != self._n_inputs or len(params) != self._n_params:
            return None
        batch = None
        for x, (dtype, rank, rest) in zip(inputs, self._input_specs):
            if type(x) is not np.ndarray or x.dtype != dtype or x.ndim != rank or x.shape[1:] != rest:
                return None
            if batch is None:
                batch = x.shape[0]
            if x.shape[0] != batch or not x.flags.c_contiguous or x.base is not None:
                return None  # views may alias parameters: the checked path copies them
            if not math.isfinite(_SUM(x, None)):
                return None  # a finite sum implies finite elements; check_arguments decides the rest
        for p, bound, shape in zip(params, self._bound, self._param_shapes):
            if p is not bound or p.shape != shape or not p.flags.writeable:
                return None
        return batch if batch else None

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Executable protocol: outputs returned, parameters updated in place."""
        outputs = self.run_plain(inputs, params)
        return self._run_checked(inputs, params) if outputs is None else outputs

    def run_plain(self, inputs: Sequence[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray] | None:
        """The call for plainly valid arguments (see ``_quick_batch``); None if they are not."""
        batch = self._quick_batch(inputs, params)
        if batch is None:
            return None
        words = self._args.words
        for x, o in zip(inputs, self._input_offsets):
            words[o] = words[o + 1] = _address(x)
            words[o + 3] = batch
        outputs = []
        for o, shape, dtype, batch_major in self._output_slots:
            out = np.empty((batch, *shape) if batch_major else shape, dtype)
            words[o] = words[o + 1] = _address(out)
            if batch_major:
                words[o + 3] = batch
            outputs.append(out)
        self._call(self._args.address)
        return outputs

    def _run_checked(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Every argument checked, views of parameters copied, any layout bound."""
        batch = check_arguments(self.graph, inputs, params)
        self._bind_params(params)
        args = self._args
        held = []  # arrays the native call reads must outlive it
        for i, x in enumerate(inputs):
            if not x.flags.c_contiguous:
                x = np.ascontiguousarray(x)
            elif x.base is not None and any(np.shares_memory(x, p) for p in params):
                x = x.copy()  # parameters are written in place while inputs are read
            held.append(x)
            if self._input_fast[i]:
                args.bind_batch_major(i, x.ctypes.data, batch)
            else:
                args.bind(i, x)
        outputs = []
        slot = self._n_inputs + self._n_params
        for k, (shape, dtype, fast) in enumerate(self._outputs):
            out = np.empty(resolve(shape, batch), dtype)
            if fast:
                args.bind_batch_major(slot + k, out.ctypes.data, batch)
            else:
                args.bind(slot + k, out)
            outputs.append(out)
        self._call(args.address)
        del held
        return outputs


class CpuBackend:
    """Compiles graphs with a CPU pass pipeline (the shipped one unless given)."""

    name = TARGET

    def __init__(self, pipeline: Pipeline | str | Path | None = None) -> None:
        self.pipeline = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline or TARGET)

    def compile(self, graph: Graph) -> CpuExecutable:
        return CpuExecutable(graph, compile_kernel(graph, self.pipeline))
