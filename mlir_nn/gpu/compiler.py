"""linalg on tensors -> outlined GPU kernels -> PTX and cubin per arch, plus the launch plan."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mlir.dialects import gpu
from mlir.ir import ArrayAttr, Context, Module, Operation
from mlir.passmanager import PassManager

from mlir_nn.gpu import fixups, fusion, matmul, reduction, schedule
from mlir_nn.gpu.modules import allow_contraction, merge_kernel_modules
from mlir_nn.gpu.pipeline import read_sections, run_section
from mlir_nn.gpu.plan import extract_plan

DEFAULT_ARCH = "sm_90"
# The PTX ISA version each arch is compiled with (the lowest that supports it).
ARCH_FEATURES = {"sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78", "sm_90": "+ptx80"}
HOST_COMPUTE = ("linalg.", "scf.", "memref.load", "memref.store")


@dataclass
class GpuProgram:
    """Everything the CUDA backend makes of one function."""

    func: str
    linalg_text: str  # the input: the step on tensors (the `linalg` stage)
    gpu_text: str  # host + gpu.module kernels after outlining (the `gpu` stage)
    plan: dict[str, Any]
    ptx: dict[str, dict[str, str]] = field(default_factory=dict)  # arch -> binary name -> PTX
    cubin: dict[str, dict[str, bytes]] = field(default_factory=dict)  # arch -> binary name -> cubin
    schedules: dict[str, int] = field(default_factory=dict)  # schedule kind -> op count
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds

    @property
    def kernel_count(self) -> int:
        return sum(1 for r in self.plan["program"] if r["op"] == "gpu.launch_func")


def _find_func(module: Module, name: str | None) -> Operation:
    funcs = [o.operation for o in module.body.operations if o.operation.name == "func.func"]
    for f in funcs:
        if name is None or f.attributes["sym_name"].value == name:
            return f
    have = [f.attributes["sym_name"].value for f in funcs]
    raise ValueError(f"cuda: no func.func @{name} in the module (have {have})")


def _apply_transform(module: Module, script: str, entry: str) -> Module:
    """Run transform entry ``entry`` of ``script`` on ``module``; return the result without the script."""
    text = str(module).rstrip()
    combined = Module.parse(text[:-1] + script + "}\n")  # the script as a nested module
    PassManager.parse(f"builtin.module(transform-interpreter{{entry-point={entry}}})").run(combined.operation)
    for op in list(combined.body.operations):
        if op.operation.name == "builtin.module":
            op.operation.erase()
    return combined


def _binaries(module: Module) -> dict[str, bytes]:
    out = {}
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            obj = gpu.ObjectAttr(ArrayAttr(op.operation.attributes["objects"])[0])
            out[op.operation.attributes["sym_name"].value] = bytes(obj.object)
    return out


def schedule_module(module: Module, func: str | None, timings: dict[str, float],
                    register_tiles: bool = True) -> tuple[Module, list[Any]]:
    """Fuse, bufferize and tile ``module`` (inside its context): blocks, threads, shared memory.

    The result is still plain loops over buffers (``scf.parallel`` for the grid,
    ``scf.forall`` with ``#gpu.thread`` mappings for the threads). float32 products become
    register-tiled kernels (``mlir_nn.gpu.matmul``) unless ``register_tiles`` is False;
    otherwise, and for float64, they are 16x16 tiles staged through shared memory, which
    can also be run on the CPU (``mlir_nn.gpu.emulate``) to check the schedule without a GPU.
    """
    sections = read_sections()
    start = time.perf_counter()
    groups = fusion.tag_groups(_find_func(module, func))
    in_registers = [g for g in groups if register_tiles and g.dtype == "f32"]
    staged = [g for g in groups if g not in in_registers]
    if staged:
        module = _apply_transform(module, fusion.fusion_script(staged), "mlirnn_fuse")
    timings["fuse"] = time.perf_counter() - start
    t = time.perf_counter()
    run_section(module, sections, "bufferize")
    fixups.erase_self_copies(_find_func(module, func))
    if in_registers:
        matmul.register_tile(_find_func(module, func), [g.name for g in in_registers])
    reduction.split_reductions(_find_func(module, func))
    plans = schedule.tag_linalg_ops(_find_func(module, func))
    timings["bufferize"] = time.perf_counter() - t
    t = time.perf_counter()
    module = _apply_transform(module, schedule.tiling_script(plans), "mlirnn_tile")
    timings["schedule"] = time.perf_counter() - t
    return module, plans


def lower_to_gpu(text: str, func: str | None = None) -> tuple[str, dict[str, Any], dict[str, int], dict[str, float]]:
    """Tensor-level MLIR text -> (outlined gpu text, plan, schedule counts, timings)."""
    sections = read_sections()
    timings: dict[str, float] = {}
    with Context():
        module, plans = schedule_module(Module.parse(text), func, timings)
        start = time.perf_counter()
        host = _find_func(module, func)
        fixups.wrap_sequential_ops(host, plans)
        run_section(module, sections, "map-blocks")
        host = _find_func(module, func)
        fixups.check_all_launched(host, lambda op: op.name.startswith(HOST_COMPUTE))
        fixups.alloc_to_workgroup_attributions(host)
        launches = fixups.tag_launches(host, plans)
        module = _apply_transform(module, schedule.thread_mapping_script([b for b, _ in launches]), "mlirnn_threads")
        timings["map"] = time.perf_counter() - start
        t = time.perf_counter()
        run_section(module, sections, "outline")
        host = _find_func(module, func)
        merge_kernel_modules(module, host, [name for _, name in launches])
        allow_contraction(module)
        plan = extract_plan(host)
        timings["outline"] = time.perf_counter() - t
        counts: dict[str, int] = {}
        for p in plans:
            counts[p.kind] = counts.get(p.kind, 0) + 1
        return str(module), plan, counts, timings


def device_binaries(gpu_text: str, arch: str, fmt: str) -> dict[str, bytes]:
    """Compile the gpu.modules of ``gpu_text`` for ``arch``: fmt "isa" (PTX) or "bin" (cubin)."""
    if arch not in ARCH_FEATURES:
        raise ValueError(f"cuda: unknown arch {arch!r}; expected one of {', '.join(ARCH_FEATURES)}")
    with Context():
        module = Module.parse(gpu_text)
        run_section(module, read_sections(), "device", chip=arch, features=ARCH_FEATURES[arch], format=fmt)
        return _binaries(module)


def compile_linalg(text: str, func: str | None = None, archs: tuple[str, ...] = (DEFAULT_ARCH,),
                   cubin: bool = True) -> GpuProgram:
    """Compile a tensor-level function to kernels for every arch in ``archs``."""
    gpu_text, plan, counts, timings = lower_to_gpu(text, func)
    program = GpuProgram(plan["func"], text, gpu_text, plan, schedules=counts, timings=timings)
    for arch in archs:
        t = time.perf_counter()
        program.ptx[arch] = {k: v.decode() for k, v in device_binaries(gpu_text, arch, "isa").items()}
        timings[f"ptx_{arch}"] = time.perf_counter() - t
        if cubin:
            t = time.perf_counter()
            program.cubin[arch] = device_binaries(gpu_text, arch, "bin")
            timings[f"cubin_{arch}"] = time.perf_counter() - t
    return program
