"""The compile pipeline of a traced step, its stages in order:

    traced Graph ── optimize ──▶ optimized Graph        egglog, through its disk cache
                 ── split ─────▶ halves at collectives  mlir_nn.distributed (steps without
                                                        collectives stay whole)
                 ── lower ─────▶ native code            the backend: MLIR passes, LLVM or CUDA
                 ── load ──────▶ Executable             run with numpy arrays

``StepPipeline.build`` runs them once, in that order. Tiers are this pipeline's policy
for when the result is needed: a cpu step whose compiled form is not in the disk caches
yet starts on a first tier (the reference ops in planned buffers, or ``quick``: the traced
graph compiled to native code with few passes and little LLVM work) while a separate process
builds it (``mlir_nn.jit.tiered``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlir_nn.backends import Executable
from mlir_nn.distributed.split import compile_step, has_collectives
from mlir_nn.ir import Graph
from mlir_nn.jit.tiered import FIRST_TIERS, QUICK_OPT_LEVEL, from_caches, quick_split
from mlir_nn.support.pipelines import load_pipeline


@dataclass(frozen=True)
class Built:
    """What the pipeline made of a traced step: the graph the backend runs, the optimizer's
    report (None when optimizing was off) and the loaded executable."""

    optimized: Graph
    report: Any
    executable: Executable


@dataclass(frozen=True)
class StepPipeline:
    """The stages for one backend; ``optimize=False`` skips the e-graph optimizer and
    ``tiered`` allows a first tier while a cold cpu step compiles: ``first_tier`` says which
    (``"interpreter"`` or ``"native"``, see ``mlir_nn.jit.tiered``)."""

    backend: str
    optimize: bool = True
    tiered: bool = False
    first_tier: str = FIRST_TIERS[0]

    def optimized(self, graph: Graph, batch_estimate: int | None) -> tuple[Graph, Any]:
        """Stage 1: the e-graph optimizer's graph and report (the traced graph when off)."""
        if not self.optimize:
            return graph, None
        from mlir_nn.egraph.cache import optimize_cached  # egglog loads only when a step needs it

        return optimize_cached(graph, batch_estimate)

    def lower(self, optimized: Graph, traced: Graph) -> Executable:
        """Stages 2-4: split at collectives, compile for the backend and load."""
        return compile_step(self.backend, optimized, traced=traced)

    def build(self, graph: Graph, batch_estimate: int | None, cached: bool = False) -> Built:
        """Every stage, in order (each through its cache); a cpu step first starts the C builds
        its compile may need and, unless the caches are expected to hold it (``cached``: a
        tiered step's compile process has filled them), the compile workers
        (``backends.cpu.prepare_compile``), to start meanwhile."""
        if self.backend == "cpu":
            from mlir_nn.backends.cpu import prepare_compile

            prepare_compile(workers=not cached)
        optimized, report = self.optimized(graph, batch_estimate)
        return Built(optimized, report, self.lower(optimized, graph))

    def quick(self, graph: Graph) -> Built:
        """The native first tier of a cpu step: the traced graph (no e-graph optimizer), lowered
        by the cpu pipeline without threads (``serial_pipeline``: one module, no compile workers;
        split into kernels from ``tiered.QUICK_SPLIT_PRODUCTS`` products on), its products calls
        of the C GEMM (``backends.gemm``), and compiled by LLVM at ``QUICK_OPT_LEVEL`` in this
        process; kept in memory only (the disk caches get the optimized code)."""
        from mlir_nn.backends import baseline, mlir_preload
        from mlir_nn.backends.cpu import TARGET, CpuExecutable, compile_kernel, serial_pipeline

        kernel = baseline.compile_step(graph)
        if kernel is not None:
            return Built(graph, None, CpuExecutable(graph, kernel))
        mlir_preload.start()  # (only LLVM's library was started: ``before_trace``)
        pipeline = serial_pipeline(load_pipeline(TARGET), split=quick_split(graph))
        kernel = compile_kernel(graph, pipeline, use_disk=False,
                                opt_level=QUICK_OPT_LEVEL, workers=False, llvm_text=False)
        return Built(graph, None, CpuExecutable(graph, kernel))

    def before_trace(self) -> None:
        """Start, as a new signature's trace begins, what compiling it in this process needs
        and can get ready on the other core meanwhile: MLIR's native library
        (``backends.mlir_preload``) and, for a cpu step, the C build of the call extension
        (``thin_call``): ``cc`` then runs while the step traces and MLIR loads, not from the
        lowering on. With the task runtime's build left out of the native first tier
        (``backends.cpu.prepare_compile``), its first call in a fresh process and cache folder,
        Adam MLPs at batch 128 (medians of alternated runs, 2 cores at a load of 7-9): 1x16
        0.77 -> 0.47 s, 4x256 1.05 -> 0.83 s. Not for the interpreter tier, whose compile
        process compiles the step."""
        interpreter_first = self.backend == "cpu" and self.tiered and self.first_tier == "interpreter"
        if self.backend not in ("cpu", "cuda") or interpreter_first:
            return
        from mlir_nn.backends import baseline, mlir_preload

        if self.backend == "cpu" and self.tiered and baseline.enabled():  # MLIR too if it declines the step
            mlir_preload.start_llvm()
        else:
            mlir_preload.start()
        if self.backend == "cpu":
            from mlir_nn.backends import gemm, thin_call

            thin_call.prepare()
            if self.tiered:  # the native first tier's products call the C GEMM
                gemm.prepare()

    def check(self, compiling: bool) -> None:
        """Fail at a step's first call on what would otherwise fail calls later: the cpu
        backend's settings and (``compiling``) its cache folder and C compiler."""
        if self.backend == "cpu":
            from mlir_nn.backends.cpu import check_environment

            check_environment(compiling)

    def tiers(self, graph: Graph) -> bool:
        """True when ``graph`` may start on the interpreter tier: a cpu step without
        collectives (a split step compiles at once)."""
        return self.tiered and self.backend == "cpu" and not has_collectives(graph)

    def cached(self, graph: Graph, batch_estimate: int | None) -> Built | None:
        """The built step when both disk caches hold it, without loading egglog or MLIR."""
        found = from_caches(graph, batch_estimate, self.optimize)
        return None if found is None else Built(*found)
