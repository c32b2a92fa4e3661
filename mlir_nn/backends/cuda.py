"""The CUDA backend: Graph -> linalg -> kernels (cubin) + launch plan -> artifact -> device.

Compiling needs MLIR (and ptxas for cubins), not a GPU; running needs a GPU and
cuda-bindings, not MLIR. ``build_artifact`` is the first half, ``mlir_nn.runtime.cuda``
the second; ``CudaBackend`` joins them for ``jit(fn, backend="cuda")`` and ``Trainer``,
through the artifact disk cache (``cuda_cache``), and its ``CudaExecutable`` keeps the
parameters on the device as ``mlir_nn.runtime.residency`` directs.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from mlir_nn.ir import Graph
from mlir_nn.runtime import residency
from mlir_nn.runtime.artifact import Artifact, signature_of


def graph_to_linalg(graph: Graph) -> tuple[str, str]:
    """(MLIR text of the step on tensors, function name): the shared tensor-level codegen."""
    from mlir_nn.codegen import emit_linalg, symbol_name
    from mlir_nn.gpu.schedule import name_ops_by_location

    module = emit_linalg(graph)
    with module.context:
        name_ops_by_location(module)  # kernels are named after the Graph op they compute
    return str(module), symbol_name(graph)


def compile_graph(graph: Graph, archs: tuple[str, ...], cubin: bool = True) -> Any:
    """The ``GpuProgram`` of ``graph`` (gpu text, plan, PTX and cubins per arch)."""
    from mlir_nn.gpu import compile_linalg

    text, func = graph_to_linalg(graph)
    return compile_linalg(text, func, archs, cubin)


def artifact_of(graph: Graph, program: Any, arch: str) -> Artifact:
    """Package one arch of a compiled program with the graph's signature."""
    from mlir_nn.support.version import __version__

    info = {"schedules": program.schedules, "kernels": program.kernel_count,
            "compile_seconds": {k: round(v, 4) for k, v in program.timings.items()}}
    return Artifact(arch, graph.fingerprint(), signature_of(graph), program.plan, program.cubin[arch],
                    program.ptx[arch], __version__, info)


def build_artifact(graph: Graph, arch: str) -> Artifact:
    """Compile ``graph`` for ``arch`` into an artifact (needs MLIR and ptxas, no GPU)."""
    return artifact_of(graph, compile_graph(graph, (arch,)), arch)


class CudaExecutable:
    """A compiled step on the GPU, with the compiler's stage texts.

    ``run`` follows ``mlir_nn.runtime.residency``: outside a resident block it uploads every
    parameter and writes the results back (``p.data`` always current); inside one it
    copies only what the ledger says is stale and leaves its results on the device.
    It is also the ledger's holder of its device copies (``fetch``).
    """

    def __init__(self, graph: Graph, step: Any, stages: dict[str, str]) -> None:
        self.graph = graph
        self.step = step
        self.stages = stages
        updated = set(step.update_slots)
        # hyperparameters: 0-d parameters the step only reads, fed from Python before each call
        self.watched = [i for i, shape in enumerate(step.param_shapes) if shape == () and i not in updated]

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        self.step.check(inputs, params)  # bad input never reaches the device
        resident = residency.active()
        ledger = residency.LEDGER
        with ledger.lock, residency.stepping():
            bound = self.step.bind([tuple(a.shape) for a in inputs])
            plan = ledger.plan(self, params, resident, self.watched)
            for t in plan.downloads:
                cast(residency.Holder, t.holder).fetch(t.slot, t.array)
            for t in plan.uploads:
                self.step.upload_param(t.slot, t.array)
            ledger.applied(plan)
            try:
                outputs = self.step.execute(bound, inputs)
                if not resident:  # the new values back into p.data
                    for slot in self.step.update_slots:
                        self.step.download_param(slot, params[slot])
            except BaseException:
                ledger.lost(self)  # its device copies may be half-updated
                raise
            ledger.stepped(self, params, self.step.update_slots, resident, plan)
        return outputs

    def fetch(self, slot: int, array: np.ndarray) -> None:
        """The ledger's download: this step's device copy of parameter ``slot`` into ``array``."""
        self.step.download_param(slot, array)


class CudaBackend:
    """Runs steps on the first GPU; constructing it fails with the reason if it cannot.

    A step's artifact comes from the disk cache (``mlir_nn.backends.cuda_cache``) when it
    was compiled before, here or on another machine; else it is compiled (MLIR, ptxas) and
    stored there.
    """

    name = "cuda"

    def __init__(self) -> None:
        from mlir_nn.runtime.driver import Device

        self.device = Device()

    def compile(self, graph: Graph) -> CudaExecutable:
        from mlir_nn.backends import cuda_cache
        from mlir_nn.runtime.cuda import CudaStep

        arch = self.device.arch
        artifact = cuda_cache.load(graph, arch)
        if artifact is not None:
            stages = {"ptx": "\n".join(artifact.ptx.values())}
        else:
            program = compile_graph(graph, (arch,))
            artifact = artifact_of(graph, program, arch)
            cuda_cache.store(artifact)
            stages = {"linalg": program.linalg_text, "gpu": program.gpu_text,
                      "ptx": "\n".join(program.ptx[arch].values())}
        return CudaExecutable(graph, CudaStep(artifact, self.device), stages)
