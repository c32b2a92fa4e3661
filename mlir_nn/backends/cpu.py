"""The compiled CPU backend: Graph -> linalg -> LLVM dialect -> native code, called in place.

``compile_kernel`` turns a graph into native code once per (graph, pipeline, target,
version) and caches it in memory and on disk. ``CpuExecutable.run`` checks the
arguments' shapes and dtypes, binds them to prebuilt memref descriptors and makes one
native call, all in one C function (``thin_call``) when the arguments are plainly valid
and in Python otherwise; parameters are updated in their own numpy buffers.

Native calling convention (after ``passes/cpu.pipeline``): arguments are the graph's
inputs, then its params, then one caller-allocated buffer per output, then the workspace
(``memref<?xi8>``: the status word, then every intermediate, see ``memory_plan``). The
step first checks its inputs for NaN and infinity, and class labels for integers in range
(``input_guard``), and writes nothing when it finds a bad one; the status word says which
input it was.

Threads: the blocks of large matrix products and element-wise ops are parallel loops that
run on the task runtime's threads (``mlir_nn.codegen.cpu_matmul``, ``task_runtime``). A fork copies only the
calling thread: in the child the runtime starts its pool again on the first task, and
each step's call lock is renewed (another thread may have held it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlir_nn.backends import gemm, host_cpu, kernel_cache, kernel_pool, task_runtime, thin_call
from mlir_nn.backends.compile_cache import LIBRARY as LIBRARY_NAME
from mlir_nn.backends.compile_cache import cache_key, read_entry, write_entry
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.memref_args import ArgumentBlock
from mlir_nn.backends.native import OPT_LEVEL, NativeFunction, gemm_calls, link_objects, load_shared_object
from mlir_nn.backends.thread_pool import num_threads
from mlir_nn.backends.workspace import CHOICE_OFFSET, MemoryPlan, Workspaces
from mlir_nn.ir import BATCH, Graph, conv_forms
from mlir_nn.ir.arguments import check_arguments, input_error, label_inputs
from mlir_nn.support import schedule_rates
from mlir_nn.support.collection import collection_paused
from mlir_nn.support.cpu_target import data_cache_bytes, register_block
from mlir_nn.support.disk_cache import writable
from mlir_nn.support.interrupts import interrupts_deferred
from mlir_nn.support.pipelines import Pipeline, load_pipeline, shipped_dir
from mlir_nn.support.version import __version__

if TYPE_CHECKING:
    from mlir_nn.backends.kernel_build import Job
    from mlir_nn.backends.kernel_split import Split

TARGET = "cpu"
# what CpuExecutable.plain_entry returns: called with a step's arguments as given (anything
# but plainly valid arrays answers None), it returns the outputs
PlainCall = Callable[[Sequence[Any]], "list[np.ndarray] | None"]


@dataclass
class Kernel:
    """Native code for one graph: the entry point, stage texts and where it came from."""

    native: NativeFunction
    stages: dict[str, str]
    plan: MemoryPlan  # the workspace it takes as its last argument
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    source: str = "compiled"  # "compiled", "disk" or "memory"
    pipeline: Pipeline | None = None  # what it was lowered with
    opt_level: int = OPT_LEVEL  # LLVM's

    @property
    def threaded(self) -> bool:
        """True when some of its loops run on the task runtime's threads."""
        return task_runtime.REGION in self.stages.get("llvm", "")


_MEMORY: dict[str, Kernel] = {}
_BACKEND_SOURCES = ("backends/cpu.py", "support/cpu_target.py", "backends/lowering.py", "backends/native.py",
                    "backends/memory_plan.py", "backends/input_guard.py", "backends/kernel_split.py",
                    "backends/kernel_build.py", "backends/kernel_cache.py", "backends/host_cpu.py",
                    "backends/task_runtime.py", "backends/task_aliasing.py", "backends/parallel_bodies.py")
# passes after which the step, private until its update results are dropped, is made public (before the second)
PUBLISH_AFTER = ("drop-equivalent-buffer-results", "inline")
PLAN_PASS = "buffer-deallocation-pipeline"  # the memory plan and the input check run right before it
SCHEDULE = "cpu_matmul.mlir"  # the transform schedule mlir_nn.codegen.cpu_matmul applies
THREAD_PASS, THREAD_LOWERING = task_runtime.THREAD_PASS, task_runtime.THREAD_LOWERING


def runs_threads(pipeline: Pipeline) -> bool:
    """True when ``pipeline`` spreads parallel loops over threads (``THREAD_PASS``)."""
    return any(p.startswith(THREAD_PASS) for p in pipeline.passes)


@cache
def codegen_digest() -> str:
    """sha256 of what turns a graph into machine code besides the pipeline text: the
    sources of the code generator and of this backend, the matmul schedule, and the host's
    register block and caches (what plans are made for). Part of the cache key, so no entry
    survives a code-generator change."""
    package = Path(__file__).resolve().parent.parent
    sources = sorted((package / "codegen").glob("*.py")) + [package / n for n in _BACKEND_SOURCES]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update((shipped_dir() / SCHEDULE).read_bytes())
    digest.update(repr((register_block(4), register_block(8), sorted(data_cache_bytes().items()))).encode())
    return digest.hexdigest()


def code_version() -> str:
    """The package version, ``codegen_digest`` and the digest of the product schedules' table of
    rates (``schedule_rates.active``: plans depend on it), for the cache keys."""
    return f"{__version__}+{codegen_digest()}+{schedule_rates.active().digest()}"


def lower(graph: Graph, pipeline: Pipeline, threads: bool = True) -> tuple[object, dict[str, str], dict[str, float]]:
    """Emit linalg, make updates in place and run ``pipeline``: (LLVM module, stages, timings).
    A split step (``kernel_split``) is lowered here kernel by kernel into one module."""
    from mlir import ir

    from mlir_nn.backends.kernel_build import lower_tail
    from mlir_nn.backends.kernel_split import pass_pointers

    module, stages, timings, _, split, _ = lower_with_plan(graph, pipeline, threads)
    if split is not None:
        start = time.perf_counter()
        module = ir.Module.parse(split.chunks(1)[0].text, module.context)
        lower_tail(module, tail_pipeline(pipeline))
        pass_pointers(module, split.step_name)
        timings["passes"] += time.perf_counter() - start
        stages["llvm"] = str(module)
    return module, stages, timings


def check_environment(compiling: bool = True) -> None:
    """What a cpu step needs, checked at its first call rather than calls later, when its
    tasks first run or its background compile is found to have failed: a valid
    ``MLIR_NN_NUM_THREADS`` and ``MLIR_NN_COMPILE_WORKERS`` (a split step's compile reads it,
    in the background process of a tiered step) and (``compiling``) a writable cache folder
    and a C compiler."""
    num_threads()
    kernel_pool.worker_count()
    if compiling:
        writable()
        if shutil.which("cc") is None and shutil.which("gcc") is None:
            raise NativeError("no C compiler (cc or gcc) on PATH: the cpu backend links each compiled step with it "
                              "(use backend='numpy' to run without one)")


def prepare_compile(workers: bool = True, tasks: bool = True, products: bool = False) -> None:
    """Start the C builds that a cold compile's native code needs (the call extension and,
    with ``tasks``, the task runtime, once per machine and cache folder) in the background,
    unless the cache holds them, and (``workers``) the compile workers (``kernel_pool``): the
    jit pipeline calls it before the e-graph optimizer, so that ``cc`` runs and the workers
    import MLIR while egglog and the lowering do (started at the lowering, the task runtime's
    build kept a 16-16-10 SGD step's LLVM stage waiting, and the worker was not ready when LLVM
    started). Code without threads (``serial_pipeline``) calls no task runtime: its build, on
    the core that the lowering's ``cc`` of the call extension needs, is left to whatever needs it.
    ``products``: the C GEMM that the quick tier's products call (``gemm``) is built too."""
    thin_call.prepare()
    if tasks:
        task_runtime.prepare()
    if products:
        gemm.prepare()
    if workers:
        kernel_pool.start()


def serial_pipeline(pipeline: Pipeline, split: bool = False) -> Pipeline:
    """``pipeline`` without threads: without ``THREAD_PASS``, which spreads parallel loops over
    threads, nor ``THREAD_LOWERING``, which would find nothing to lower (a conversion over the
    whole module all the same: 9 ms of a 16x64 Adam step's quick build), and (unless ``split``)
    no ``kernel_split.SPLIT_PASS``, so the step stays one function (compiled in the calling
    process, as the quick tier's is: ``mlir_nn.jit.tiered``). With ``split`` its kernels become
    functions of their own (LLVM's loop passes take superlinear time in one function's size),
    compiled in this process when without workers (``_build``)."""
    from mlir_nn.backends.kernel_split import SPLIT_PASS

    kept = tuple(p for p in pipeline.passes if (split or not p.startswith(SPLIT_PASS))
                 and not p.startswith(THREAD_PASS) and not p.startswith(THREAD_LOWERING))
    return Pipeline(f"{pipeline.name}-serial" + ("-split" if split else ""), kept)


def tail_pipeline(pipeline: Pipeline) -> Pipeline:
    """The passes that each chunk of a split step runs by itself (``kernel_split.SPLIT_PASS`` on)."""
    from mlir_nn.backends.kernel_split import SPLIT_PASS

    cut = next((i for i, p in enumerate(pipeline.passes) if p.startswith(SPLIT_PASS)), len(pipeline.passes))
    return Pipeline(pipeline.name, pipeline.passes[cut:])


def lower_with_plan(graph: Graph, pipeline: Pipeline, threads: bool = True, llvm_text: bool = True,
                    quick: bool = False, linalg_text: bool = True) -> tuple[
                        object, dict[str, str], dict[str, float], MemoryPlan | None, Split | None, tuple[str, ...]]:
    """``lower`` and the step's memory plan (None when the pipeline has no ``PLAN_PASS``).
    Large products use threads when ``threads`` is set and the pipeline has
    ``THREAD_PASS``. Right before ``PLAN_PASS`` the step's buffers become views of one workspace
    argument and an input check guards the body (``memory_plan``, ``input_guard``). A
    pipeline with ``kernel_split.SPLIT_PASS`` stops there: the step is split into kernels
    (the fifth item; ``stages`` then has no "llvm" text yet), else that item is None (and
    ``stages`` has the "llvm" text unless ``llvm_text`` is off: the compile prints it; the "linalg"
    text unless ``linalg_text`` is off: 9 ms of the quick tier's 8x64 Adam compile). The
    last item lists the passes run: ``PLAN_PASS`` is skipped when the plan left no heap buffer
    (``memory_plan.needs_deallocation``; it took 0.3 to 0.5 s of a deep MLP's build). ``quick``: for
    LLVM at -O0, the float products call the C GEMM (``codegen.gemm_calls``), the others' schedule
    unrolls less (``cpu_matmul.rewrite_matmuls``) and f32 exp and erf stay calls of libm."""
    with interrupts_deferred():  # MLIR's modules register dialects as they load: never half loaded
        from mlir_nn.backends.input_guard import guard_inputs
        from mlir_nn.backends.kernel_split import split_step
        from mlir_nn.backends.lowering import run_pipeline
        from mlir_nn.backends.memory_plan import needs_deallocation, plan_memory
        from mlir_nn.codegen import emit_linalg, symbol_name
        from mlir_nn.codegen.copies import strided_copies_as_loops
        from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
        from mlir_nn.codegen.flat_sums import flatten_whole_reductions
        from mlir_nn.codegen.fp_env import flush_subnormals
        from mlir_nn.codegen.fuse_updates import fuse_elementwise_chains
        from mlir_nn.codegen.gemm_calls import products_as_calls
        from mlir_nn.codegen.hoist_scalars import hoist_scalar_work
        from mlir_nn.codegen.inline_math import inline_f32_math
        from mlir_nn.codegen.inplace import copy_repeated_results, publish_step, write_updates_in_place
        from mlir_nn.codegen.lane_loads import scalarize_lane_loads
        from mlir_nn.codegen.parallel_maps import spread_maps
        from mlir_nn.codegen.partials_in_place import sum_over_first_partials
        from mlir_nn.codegen.recompute import recompute_cheap_maps

    timings: dict[str, float] = {}
    start = time.perf_counter()
    threads = threads and runs_threads(pipeline)
    # float32 sums accumulate in float64; batched products' loops run as tasks on threads
    module = emit_linalg(graph, wide_sums=True, strided_copies=True, batch_tasks=threads, scalars=True)
    stages = {"linalg": module.operation.get_asm(assume_verified=True)} if linalg_text else {}  # (verified next)
    if not quick:  # at -O0 nothing vectorizes: the expansions only cost compile time (quick tier,
        # Adam MLPs at batch 128, compile CPU time: 8x64 0.60 -> 0.45 s, 4x256 0.32 -> 0.26; a
        # 4099x256 float32 exp + sigmoid: 9-11 ms either way)
        inline_f32_math(module)  # no libm call per element: loops with exp or erf vectorize
    recompute_cheap_maps(module)  # x * c read again by a later pass: recomputed there, not stored
    slot = {p.attr("name"): len(graph.inputs) + i for i, p in enumerate(graph.params)}
    fn = module.body.operations[0]
    # the step is private until the update results are dropped, then public again (publish_step); a
    # pipeline without those passes (a user's) gets a public wrapper that calls it
    publish = [p.split("{")[0] for p in pipeline.passes if p.split("{")[0] in PUBLISH_AFTER] == list(PUBLISH_AFTER)
    write_updates_in_place(module, fn, len(graph.outputs), [slot[name] for name, _ in graph.updates],
                           wrapper=not publish)
    rewrite_matmuls(module, threads, graph.batch_rows, num_threads() if threads else None, quick, library=quick)
    timings["codegen"] = time.perf_counter() - start
    start = time.perf_counter()
    plans: list[MemoryPlan] = []

    def plan_and_guard(module: object) -> bool:
        """The plan and the input check; True (skip ``PLAN_PASS``) when no heap buffer is left."""
        plan, workspace = plan_memory(module, batch_dims(graph))
        guard_inputs(module, list(range(len(graph.inputs))), workspace, label_inputs(graph), tasks=threads)
        plans.append(plan)
        return not needs_deallocation(module)


    def fuse_and_hoist(module: object) -> None:
        sum_over_first_partials(module)  # no copy of a product's first partial sum
        if not quick:  # one pass per update chain (SGD momentum's in the e-graph's graphs). The traced
            # graphs of the quick tier come with their chains fused by the emission (``codegen.builder``):
            # it fused none of SGD's (momentum, Nesterov, weight decay), Adam's, AdamW's, RMSprop's or
            # Adagrad's, and its walk took 3 ms of 8x64 SGD's first call, 17 ms of 16x64 Adam's
            fuse_elementwise_chains(module)
        hoist_scalar_work(module)  # scalar work (bias corrections) once, not per element
        if threads:
            spread_maps(module, num_threads())  # the fused passes in row blocks, one a thread at most

    def to_memrefs(module: object) -> None:
        flush_subnormals(module, symbol_name(graph))
        if quick:  # bufferized: the products left as linalg.matmul become calls of the C GEMM
            products_as_calls(module)

    hooks = {"eliminate-empty-tensors": flatten_whole_reductions,  # once fused (see codegen.flat_sums)
             "drop-equivalent-buffer-results": fuse_and_hoist,
             "buffer-results-to-out-params": copy_repeated_results,
             PLAN_PASS: plan_and_guard,
             "convert-bufferization-to-memref": to_memrefs,
             "convert-linalg-to-loops": strided_copies_as_loops}
    if publish:
        hooks[PUBLISH_AFTER[1]] = lambda module: publish_step(module, symbol_name(graph))
    tail = tail_pipeline(pipeline)
    head = Pipeline(pipeline.name, pipeline.passes[:len(pipeline.passes) - len(tail.passes)])
    passes = run_pipeline(module, head if tail.passes else pipeline, hooks)
    split = None
    if tail.passes and plans:
        split = split_step(module)
    else:
        scalarize_lane_loads(module)
        if llvm_text:
            stages["llvm"] = str(module)
    timings["passes"] = time.perf_counter() - start
    return module, stages, timings, plans[-1] if plans else None, split, passes


def batch_dims(graph: Graph) -> set[tuple[int, int]]:
    """(argument, dim) pairs of the native function that hold the batch size."""
    leaves = list(graph.inputs) + list(graph.params) + list(graph.outputs)
    return {(i, d) for i, node in enumerate(leaves) for d, size in enumerate(node.shape) if size == BATCH}


def _key(graph: Graph, pipeline: Pipeline, threads: bool, opt_level: int) -> str:
    target = f"{TARGET}-threads={num_threads()}" if threads else f"{TARGET}-serial"  # (spread_maps' blocks)
    if forced := conv_forms.forced_form():  # the convolutions' code depends on it, not on the graph
        target += f"-conv-form={forced}"
    return cache_key(graph.fingerprint(), pipeline.text, target, code_version(), opt_level)


def cached_kernel(graph: Graph, pipeline: Pipeline | None = None, threads: bool = True,
                  opt_level: int = OPT_LEVEL) -> Kernel | None:
    """Native code for ``graph`` from the memory or the disk cache, or None. Imports no MLIR
    (the key covers the graph's text, its name included)."""
    pipeline = pipeline or load_pipeline(TARGET)
    key = _key(graph, pipeline, threads, opt_level)
    if key in _MEMORY:
        return replace(_MEMORY[key], timings={}, source="memory")
    start = time.perf_counter()
    entry = read_entry(key)
    if entry is None:
        return None
    try:
        plan = MemoryPlan.from_json(entry.meta["memory_plan"])
        native = load_shared_object(entry.library, str(entry.meta["symbol"]), products=opt_level == 0)
    except (NativeError, KeyError, TypeError, ValueError):
        return None
    kernel = Kernel(native, entry.stages, plan, {"load": time.perf_counter() - start}, "disk", pipeline, opt_level)
    _MEMORY[key] = kernel
    return kernel


def compile_kernel(graph: Graph, pipeline: Pipeline | None = None, use_disk: bool = True,
                   threads: bool = True, opt_level: int = OPT_LEVEL, workers: bool = True,
                   llvm_text: bool = True) -> Kernel:
    """Native code for ``graph`` from the memory cache, the disk cache, or a fresh compile.
    ``threads=False`` builds every product to run on the calling thread; ``opt_level`` is
    LLVM's (0: no IR passes, for the quick tier, ``mlir_nn.jit.tiered``); ``workers=False``
    starts no compile workers and compiles a split step in this process (``_build``);
    ``llvm_text=False`` (with ``use_disk`` off: the disk cache keeps every stage)
    leaves the "llvm" and "linalg" stages out of a fresh compile (the quick tier: printing them took
    0.05 s of a 4x256 Adam MLP's first call), split or not when compiled in this process (``workers`` off)."""
    pipeline = pipeline or load_pipeline(TARGET)
    key = _key(graph, pipeline, threads, opt_level)
    if key in _MEMORY and (not llvm_text or "llvm" in _MEMORY[key].stages):
        return replace(_MEMORY[key], timings={}, source="memory")
    if use_disk:
        kernel = cached_kernel(graph, pipeline, threads, opt_level)
        if kernel is not None:
            return kernel
    with collection_paused():  # the garbage collector's passes cost a cold compile 5-10%
        kernel = _compile(graph, pipeline, key, use_disk, threads, opt_level, workers, llvm_text)
    _MEMORY[key] = kernel
    return kernel


def _compile(graph: Graph, pipeline: Pipeline, key: str, use_disk: bool, threads: bool, opt_level: int,
             workers: bool, llvm_text: bool) -> Kernel:
    """``compile_kernel``'s fresh compile (stored on disk under ``key`` with ``use_disk``)."""
    with interrupts_deferred():  # MLIR's modules register dialects as they load: never half loaded
        from mlir_nn.backends.lowering import LoweringError, check_lowered_to_llvm
        from mlir_nn.codegen import symbol_name

    # the workers import MLIR while this process lowers (started already when the step came through
    # the jit pipeline), and cc runs
    prepare_compile(workers, tasks=runs_threads(pipeline), products=opt_level == 0)
    if opt_level > 0:  # the target every function compiled with IR passes is tuned for (kernel_build)
        host_cpu.prepare()
    # at -O0 LLVM schedules nothing: the schedule's unrolled copies would cost compile time only
    module, stages, timings, plan, split, _ = lower_with_plan(graph, pipeline, threads, llvm_text=False,
                                                              quick=opt_level == 0, linalg_text=llvm_text or use_disk)
    if plan is None:
        if split is None:  # what it left unlowered, named first (else checked only if LLVM fails)
            check_lowered_to_llvm(module, pipeline)
        raise LoweringError(f"pipeline {pipeline.name} has no {PLAN_PASS} pass: the cpu backend places the "
                            "step's buffers in its workspace and checks its inputs right before that pass")
    with tempfile.TemporaryDirectory() as tmp:
        library = Path(tmp) / LIBRARY_NAME
        native = _build(graph, pipeline, module, stages, timings, split, library, use_disk, opt_level,
                        llvm_text or use_disk, workers)
        if use_disk:
            start = time.perf_counter()
            _store(key, library, symbol_name(graph), stages, plan)
            timings["cache-write"] = time.perf_counter() - start
    return Kernel(native, stages, plan, timings, "compiled", pipeline, opt_level)


def _build(graph: Graph, pipeline: Pipeline, module: object, stages: dict[str, str], timings: dict[str, float],
           split: Split | None, library: Path, use_disk: bool = True, opt_level: int = OPT_LEVEL,
           llvm_text: bool = True, workers: bool = True) -> NativeFunction:
    """Compile the lowered step (in chunks on the workers when it was split), link ``library``
    and load it; adds the "llvm" stage (unless ``llvm_text`` is off and the step was compiled in
    this process: not split, or split without ``workers`` or ``use_disk``) and the time of each
    part. With ``use_disk`` a split step links the kernels it finds in the kernel cache and stores
    the ones it compiles; without ``workers`` it is one module, which without ``use_disk`` stays
    in this process's JIT (``kernel_build.compile_resident``: nothing linked or loaded), and
    without ``llvm_text`` either (the quick tier) two cores compile it (``_compile_split``)."""
    from mlir_nn.backends.kernel_build import Job, compile_resident, kernels_only, lower_chunk, merge_texts
    from mlir_nn.backends.kernel_split import Chunk
    from mlir_nn.codegen import symbol_name

    name = symbol_name(graph)
    start = time.perf_counter()
    linked: list[kernel_cache.StoredObject] = []  # cached objects of kernels
    keys: dict[str, str] = {}  # kernel -> its key in the kernel cache
    if split is None or not (llvm_text or use_disk or workers):  # one module, compiled here
        threaded = runs_threads(pipeline)
        if split is None:  # a pipeline without the split pass: lowered whole already, compiled as it is
            job = Job(Chunk("", ("_mlir_ciface_" + name,), (), step=name), pipeline, library.parent / "chunk0.o",
                      opt_level)
        else:  # every kernel a function of its own in the one module
            job = Job(split.chunks(1)[0], tail_pipeline(pipeline), library.parent / "chunk0.o", opt_level)
            if not (use_disk or llvm_text or threaded):  # the step and the kernels on two cores
                resident = _compile_split(split, tail_pipeline(pipeline), module.context, opt_level)
                if resident is not None:
                    timings["llvm"] = time.perf_counter() - start
                    return resident
            module = lower_chunk(job, module.context)  # (the lowering's)
        # kept in memory when not stored: no object file, link or load (10-15 ms)
        text, resident = compile_resident(module, job, llvm_text, resident=not use_disk, tasks=threaded)
        if text is not None:
            stages["llvm"] = text
        if resident is not None:
            timings["llvm"] = time.perf_counter() - start
            return resident
        jobs = [job]
        tasks = task_runtime.REGION in text if text is not None else threaded
        products = bool(gemm_calls(module))
    else:
        tail = tail_pipeline(pipeline)
        count = kernel_pool.worker_count() + 1 if workers else 1  # the caller builds too
        if use_disk:
            keys = kernel_keys(split, tail, opt_level)
            linked, fresh = kernel_cache.select(split.kernels, kernel_cache.lookup(keys))
            # objects that call kernels of other objects are not cached (a step that linked one
            # would need those too): the step with every kernel in one module, or apart from them
            chunks = split.chunks(1) if count == 1 and not linked else split.apart(fresh, count)
        else:
            chunks = split.chunks(count)
        jobs = [Job(chunk, tail, library.parent / f"chunk{i}.o", opt_level) for i, chunk in enumerate(chunks)]
        texts = kernel_pool.run(jobs)
        stages["llvm"] = merge_texts(texts + [kernels_only(s.text, s.kernels & split.kernels.keys()) for s in linked])
        if use_disk:
            _store_kernels(jobs, texts, keys, name)
        tasks = task_runtime.REGION in stages["llvm"]
        products = any(symbol in stages["llvm"] for symbol in gemm.SYMBOLS)
    timings["llvm"] = time.perf_counter() - start
    start = time.perf_counter()
    link_objects([job.path for job in jobs] + [stored.path for stored in linked], library)
    native = load_shared_object(library, name, tasks=tasks, products=products)
    timings["link"] = time.perf_counter() - start
    return native


def _compile_split(split: Split, tail: Pipeline, context: object, opt_level: int) -> NativeFunction | None:
    """``split`` compiled into this process's JIT on two cores: the step alone and its kernels in
    two modules (``kernel_build.compile_resident_split``); None when it has no kernel."""
    from mlir_nn.backends.kernel_build import Job, compile_resident_split

    chunks = split.apart(split.kernels, 1)  # the step alone, then every kernel
    if len(chunks) < 2:
        return None
    step, kernels = (Job(chunk, tail, Path(), opt_level) for chunk in chunks)
    return compile_resident_split(step, kernels, context)


def kernel_keys(split: Split, tail: Pipeline, opt_level: int = OPT_LEVEL) -> dict[str, str]:
    """The key in the kernel cache of each kernel of ``split``, lowered with ``tail`` and
    compiled at ``opt_level``."""
    salt = "\0".join((tail.text, code_version(), f"O{opt_level}"))
    return {kernel: kernel_cache.kernel_key(text, salt) for kernel, text in split.kernels.items()}


def _store_kernels(jobs: list[Job], texts: list[str], keys: dict[str, str], step: str) -> None:
    """Keep each compiled object's kernels in the kernel cache; in the copy of the object that
    holds the step, the step's symbols are local (another step of that name may link it). A
    failure only costs a later step a compile."""
    from mlir_nn.backends.native import localize_symbols, step_symbols

    for job, text in zip(jobs, texts):
        if not job.chunk.kernels or job.chunk.calls:
            continue
        try:
            path = job.path
            if job.chunk.step:
                path = job.path.with_suffix(".kernels.o")
                localize_symbols(job.path, path, step_symbols(step))
            kernel_cache.store(path, text, {k: keys[k] for k in job.chunk.kernels})
        except (OSError, NativeError) as error:
            warnings.warn(f"mlir-nn: could not write the kernel cache: {error}", RuntimeWarning, stacklevel=4)
            return


def _store(key: str, library: Path, name: str, stages: dict[str, str], plan: MemoryPlan) -> None:
    """Write the disk-cache entry; a failure only costs the next process a recompile."""
    try:
        write_entry(key, library, {"symbol": name, "target": TARGET, "version": __version__,
                                   "memory_plan": plan.to_json()}, stages)
    except OSError as error:
        warnings.warn(f"mlir-nn: could not write the compile cache entry: {error}", RuntimeWarning, stacklevel=3)


def clear_memory_cache() -> None:
    """Forget the kernels compiled in this process (the disk cache stays)."""
    _MEMORY.clear()


_EXECUTABLES: weakref.WeakSet[CpuExecutable] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for executable in list(_EXECUTABLES):
        executable.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class CpuExecutable:
    """A compiled step bound to prebuilt argument descriptors and a workspace per batch size.

    Calls with plainly valid arguments (``run_plain``) are checked, bound and made by one C
    function (``thin_call``): batch-major or static-shaped C-contiguous inputs that are no
    views and overlap no parameter, and the parameter arrays bound last call with the dtype,
    shape, strides and writability they had then. Anything else takes the fully checked path
    in Python (``run``), which binds, and snapshots for the C function, what it validated.
    Input values are checked by the compiled step itself. One lock (the C function's)
    serializes the calls of a step: its descriptors, its workspaces and the parameters it
    updates are shared by every thread that calls it. Each call's outputs are fresh arrays,
    allocated before the native call (a failure is a MemoryError with nothing written) and
    handed to the caller once the step has written them: only their data pointers are
    bound per call, their sizes and strides with the batch size.
    """

    def __init__(self, graph: Graph, kernel: Kernel) -> None:
        self.graph = graph
        self.stages = kernel.stages
        leaves = list(graph.inputs) + list(graph.params) + list(graph.outputs)
        self._args = ArgumentBlock([len(n.shape) for n in leaves] + [1])  # + the workspace
        self._n_inputs = len(graph.inputs)
        self._n_params = len(graph.params)
        self._output_slot = self._n_inputs + self._n_params
        self._workspace_slot = len(leaves)
        self._input_fast = [self._batch_major(n.shape) for n in graph.inputs]
        all_fast = all(fast or BATCH not in n.shape for n, fast in zip(graph.inputs, self._input_fast))
        for i, node in enumerate(graph.inputs):
            if self._input_fast[i]:
                self._args.set_batch_major_layout(i, node.shape[1:])
            elif BATCH not in node.shape:
                self._args.set_static_layout(i, node.shape)
        # (dtype, sizes, batch-major, first descriptor word) per input; None when some input has
        # the batch in another dim: such steps always take the checked path
        specs = [(np.dtype(n.dtype), [0 if d == BATCH else d for d in n.shape], fast, self._args.offsets[i])
                 for i, (n, fast) in enumerate(zip(graph.inputs, self._input_fast))]
        self._entry = thin_call.extension().ThinCall(
            kernel.native.address, self._args.address, self._args.words.ctypes.data, (self._args, specs),
            specs if all_fast else None, self._n_params, self._input_error,
            task_runtime.step_runner() if kernel.threaded else 0, CHOICE_OFFSET)
        # the call for plainly valid arguments (see the class docstring); None if they are not
        self.run_plain: Callable[[Sequence[Any], Sequence[np.ndarray]], list[np.ndarray] | None] = self._entry.run
        self.kernel = kernel
        outputs = [(n.shape, np.dtype(n.dtype)) for n in graph.outputs]
        self._workspaces = Workspaces(kernel.plan, outputs, graph.name)
        self._workspace = None
        self._workspace_batch: int | None = None
        self._bound_arrays: list[np.ndarray | None] = [None] * self._n_params
        _EXECUTABLES.add(self)

    def _input_error(self, index: int, inputs: Sequence[np.ndarray]) -> ValueError:
        return input_error(self.graph, index, inputs[index])

    def after_fork(self) -> None:
        """In a forked child: a new call lock (a lock another thread held stays held in the
        child) and nothing bound, the workspace included."""
        self._entry.after_fork()
        self._workspace_batch = None

    def _bind_workspace(self, batch: int) -> list[np.ndarray]:
        """Point the workspace descriptor at the workspace for ``batch`` and the output
        descriptors at fresh arrays for this call's outputs, which it returns."""
        if batch != self._workspace_batch:
            self._workspace, _ = self._workspaces.get(batch)
            self._args.bind(self._workspace_slot, self._workspace.buffer)
            self._workspace_batch = None  # until the C side knows it too
            self._entry.bind_workspace(batch, self._workspace.buffer, self._workspace.outputs,
                                       tuple(self._args.offsets[self._output_slot + k]
                                             for k in range(len(self._workspace.outputs))))
            self._workspace_batch = batch
        outputs = self._workspace.fresh_outputs()
        for k, out in enumerate(outputs):
            self._args.bind(self._output_slot + k, out)
        return outputs

    def team_choice(self, batch: int = 1) -> dict[str, int | str | None] | None:
        """What the task runtime measured of this step's calls at ``batch`` rows (which team width
        runs them faster: ``task_runtime.team_choice``); None before the first call at that size."""
        found = self._workspaces.peek(batch)
        return None if found is None else task_runtime.team_choice(found.buffer)

    @staticmethod
    def _batch_major(shape: tuple) -> bool:
        """True when only the leading dim is the batch (sizes change in one word, strides never)."""
        return bool(shape) and shape[0] == BATCH and BATCH not in shape[1:]

    def _bind_params(self, params: list[np.ndarray]) -> None:
        """Bind the parameters (they must not share memory) and snapshot them for ``run_plain``."""
        for i, p in enumerate(params):
            if not p.flags.c_contiguous:
                raise ValueError(f"{self.graph.name}: parameter {self.graph.params[i].attr('name')} is not "
                                 "C-contiguous; the cpu backend updates parameters in place in their own buffers")
        if any(p is not q for p, q in zip(params, self._bound_arrays)):
            self._check_param_overlap(params)
        for i, p in enumerate(params):
            self._args.bind(self._n_inputs + i, p)
        self._bound_arrays = list(params)
        self._entry.bind_params(params)

    def _check_param_overlap(self, params: list[np.ndarray]) -> None:
        for i in range(len(params)):
            for j in range(i + 1, len(params)):
                if np.shares_memory(params[i], params[j]):
                    a, b = (self.graph.params[k].attr("name") for k in (i, j))
                    raise ValueError(f"{self.graph.name}: parameters {a} and {b} share memory; "
                                     "the cpu backend updates parameters in place and needs separate buffers")

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Executable protocol: outputs returned, parameters updated in place."""
        outputs = self.run_plain(inputs, params)
        return self._run_checked(inputs, params) if outputs is None else outputs

    def plain_entry(self, holders: Sequence[object], attribute: str,
                    feeds: Sequence[tuple[int, Callable[[], float]]]) -> PlainCall:
        """``run_plain`` as one C call that reads parameter i from ``holders[i].<attribute>`` and
        first writes ``source()`` into the 0-d parameter j for every (j, source) in ``feeds``."""
        self._entry.watch(tuple(holders), attribute, list(feeds))
        return self._entry.run_captured

    def _run_checked(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Every argument checked, inputs that may overlap a parameter copied, any layout bound."""
        batch = check_arguments(self.graph, inputs, params, check_values=False)
        held = []  # arrays the native call reads must outlive it
        for x in inputs:
            if not x.flags.c_contiguous:
                x = np.ascontiguousarray(x)
            elif any(np.may_share_memory(x, p) for p in params):
                x = x.copy()  # parameters are written in place while inputs are read
            held.append(x)
        with self._entry:
            self._bind_params(params)
            for i, x in enumerate(held):
                if self._input_fast[i]:
                    self._args.bind_batch_major(i, x.ctypes.data, batch)
                else:
                    self._args.bind(i, x)
            outputs = self._bind_workspace(batch or 1)
            self._entry.call_native()
            status = self._entry.status()
            if status:
                raise input_error(self.graph, status - 1, held[status - 1])
            return outputs


class CpuBackend:
    """Compiles graphs with a CPU pass pipeline (the shipped one unless given), LLVM at
    ``opt_level`` (default ``MLIR_NN_OPT_LEVEL``)."""

    name = TARGET

    def __init__(self, pipeline: Pipeline | str | Path | None = None, opt_level: int = OPT_LEVEL) -> None:
        self.pipeline = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline or TARGET)
        self.opt_level = opt_level

    def compile(self, graph: Graph) -> CpuExecutable:
        return CpuExecutable(graph, compile_kernel(graph, self.pipeline, opt_level=self.opt_level))

    def load_cached(self, graph: Graph) -> CpuExecutable | None:
        """The executable when its native code is in the memory or disk cache, else None."""
        kernel = cached_kernel(graph, self.pipeline, opt_level=self.opt_level)
        return None if kernel is None else CpuExecutable(graph, kernel)
