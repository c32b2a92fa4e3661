"""One module of a split step (a kernel, or the step that calls them) to an object file.

The module runs the rest of the pipeline (from ``kernel_split.SPLIT_PASS`` on) by itself,
then LLVM compiles it. Functions that the lowering added to a kernel (the bodies of its
parallel loops, ``parallel_bodies``) are made internal, so the objects of many kernels link
into one shared object, and renamed after the chunk in its LLVM text, so that the texts
merge into one module.
Runs in the compiling process or in a worker (``kernel_pool``); imports MLIR.
"""

from __future__ import annotations

import ctypes
import re
import tempfile
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from mlir import ir

from mlir_nn.backends.engine_capi import Engine
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.host_cpu import tune_for_host
from mlir_nn.backends.kernel_split import NOALIAS, Chunk, pass_pointers
from mlir_nn.backends.llvm_jit import Jit
from mlir_nn.backends.lowering import check_lowered_to_llvm, run_pipeline
from mlir_nn.backends.native import OPT_LEVEL, NativeFunction, calls_only_loaded, compile_in_memory, compile_object
from mlir_nn.backends.parallel_bodies import BODY_PREFIX, outline_parallel_bodies, schedule_worksharing_loops
from mlir_nn.backends.task_aliasing import mark_task_arguments
from mlir_nn.backends.task_runtime import THREAD_PASS
from mlir_nn.codegen.copies import strided_copies_as_loops
from mlir_nn.codegen.lane_loads import scalarize_lane_loads
from mlir_nn.codegen.walk import symbol
from mlir_nn.support.interrupts import interrupts_deferred
from mlir_nn.support.pipelines import Pipeline

_DEFINITIONS = ("llvm.func", "llvm.mlir.global")


@dataclass(frozen=True)
class Job:
    """Compile ``chunk`` with ``tail`` (the pipeline's passes from the split on) into ``path``,
    LLVM at ``opt_level``."""

    chunk: Chunk
    tail: Pipeline
    path: Path
    opt_level: int = OPT_LEVEL


def lower_tail(module: ir.Module, tail: Pipeline, parsed: bool = False) -> None:
    """The pipeline's passes from the split on, with the hooks the cpu backend runs there;
    ``parsed``: the module was just parsed, which verified it."""
    run_pipeline(module, tail, {THREAD_PASS: _outline_bodies, "convert-linalg-to-loops": strided_copies_as_loops},
                 verified=parsed)
    scalarize_lane_loads(module)


def _outline_bodies(module: ir.Module) -> None:
    outline_parallel_bodies(module)  # (a hook: its pass runs after it)
    mark_task_arguments(module)


def _is_definition(op: ir.Operation) -> bool:
    if op.name == "llvm.func":
        return bool(op.regions[0].blocks)
    return op.name == "llvm.mlir.global" and ("value" in op.attributes or bool(op.regions[0].blocks))


def localize(module: ir.Module, public: tuple[str, ...]) -> list[str]:
    """Make every definition of ``module`` but ``public`` internal; returns their names."""
    internal = ir.Attribute.parse("#llvm.linkage<internal>")
    names = []
    for op in [op.operation for op in module.body.operations]:
        if op.name in _DEFINITIONS and _is_definition(op) and symbol(op) not in public:
            names.append(symbol(op))
            op.attributes["linkage"] = internal
    return names


def rename(text: str, names: list[str], prefix: str) -> str:
    """The printed module ``text`` with the symbols ``names`` renamed ``<prefix>_<name>``, so that
    the LLVM texts of chunks merge into one module (``prefix``: the chunk's first public name,
    unique: a kernel's hash, or the step's name). Only the text: internal symbols of different
    objects do not clash, so the compiled module keeps its names (no second parse)."""
    if not names:
        return text
    pattern = re.compile("@(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w$.])")
    return pattern.sub(lambda m: f"@{prefix}_{m.group(1)}", text)


def mark_kernels(module: ir.Module, kernels: tuple[str, ...]) -> None:
    """Kernels stay functions of their own (LLVM would inline each into the step, and keep
    it too), and so do their parallel loops' bodies (called twice: from the loop and from its
    guard for a single iteration, ``parallel_bodies``); ``noalias`` on the pointer arguments
    that ``kernel_split`` found unshared in kernels, and ``task_aliasing`` in their bodies."""
    for op in [op.operation for op in module.body.operations]:
        if op.name != "llvm.func" or not op.regions[0].blocks:
            continue
        if symbol(op) in kernels or symbol(op).startswith(BODY_PREFIX):
            op.attributes["no_inline"] = ir.UnitAttr.get()
        if NOALIAS not in op.attributes:
            continue
        marked = set(ir.DenseI64ArrayAttr(op.attributes[NOALIAS]))
        count = len(op.regions[0].blocks[0].arguments)
        op.attributes["arg_attrs"] = ir.ArrayAttr.get(
            [ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()} if i in marked else {}) for i in range(count)])


def inline_step(module: ir.Module, step: str) -> None:
    """The step (internal, ``localize``) inlined into its C interface, its only caller. A public
    step got a packed wrapper of its own from the JIT, and it and the C interface each called
    it with every memref as its pointers, offset, sizes and strides: one call of 750 arguments
    for a 16-layer MLP with Adam, whose instruction selection was most of LLVM's time (the
    C interface alone took 0.86 of the module's 2.2 s)."""
    for op in [op.operation for op in module.body.operations]:
        if op.name == "llvm.func" and symbol(op) == step:
            op.attributes["always_inline"] = ir.UnitAttr.get()


def select_fast(module: ir.Module, interface: str) -> None:
    """The C interface ``interface`` of a step split into kernels, with the step inlined, compiled
    as ``optnone``: LLVM's fast instruction selection and no machine-level optimization for it alone.
    Its body is only calls of the kernels and their arguments (the descriptors' fields loaded at
    entry, live across every call), and the code generator, which the JIT runs at its default
    level even at -O0, took most of the quick tier's LLVM time over it: 45 of 85 ms for 8x64 Adam,
    97 of 135 ms for 16x64 (all kernels of a deep MLP are the same 24). With ``optnone`` (and
    ``noinline``, which it needs) the step is inlined still (``always_inline``), its instruction
    selection took 18 -> 4 ms (16x64, ``llc -time-passes``), and the kernels keep their code. Most of
    what is left is register allocation (greedy, 33 of 51 ms at 16x64): its values live across every call.
    Measured and not taken: the step optnone but not inlined (its 412 arguments passed by the C
    interface): 16x64 JIT 101-110 -> 156-176 ms; the kernels called with ``preserve_mostcc``: the
    step's code generation 50-65 ms either way; pieces on single elements (step counts, 0-d copies: 42
    of 131 calls at 8x64) left in the step: JIT 5-6 ms less, first call within its noise."""
    for op in [op.operation for op in module.body.operations]:
        if op.name == "llvm.func" and symbol(op) == interface:
            op.attributes["optimize_none"] = ir.UnitAttr.get()
            op.attributes["no_inline"] = ir.UnitAttr.get()


def lower_chunk(job: Job, context: ir.Context | None = None) -> ir.Module:
    """``job``'s chunk parsed in ``context`` (default: a context of its own, which the module
    keeps; a new context loads every dialect, 5-7 ms) and lowered by its tail."""
    with context or ir.Context():
        module = ir.Module.parse(job.chunk.text)
        lower_tail(module, job.tail, parsed=True)
    return module


def build(job: Job) -> str:
    """Lower and compile ``job``; returns the module's LLVM-dialect text."""
    return compile_lowered(lower_chunk(job), job)


def compile_lowered(module: ir.Module, job: Job, text: bool = True) -> str | None:
    """Compile ``module``, ``job``'s chunk with its tail already run, into ``job.path``; returns
    its LLVM-dialect text (None unless ``text``). A step lowered whole (no split) comes here
    straight from the lowering, in its own context: no print and parse between them (a 4x256
    Adam MLP step's 25k lines)."""
    return compile_resident(module, job, text, resident=False)[0]


def compile_resident(module: ir.Module, job: Job, text: bool = True, resident: bool = True,
                     tasks: bool = False) -> tuple[str | None, NativeFunction | None]:
    """``compile_lowered``, but (``resident``) the code stays in this process's JIT when every
    function it calls is here (``native.compile_in_memory``; ``tasks``: it calls the task
    runtime): (text, its entry point), else it goes to ``job.path`` as an object: (text, None)."""
    with module.context:
        internal = _prepare(module, job)
        printed = module.operation.get_asm(assume_verified=True) if text else None  # (str() verifies: 10% more)
        native = None
        try:
            if resident:
                native = compile_in_memory(module, job.chunk.public[0], job.opt_level, tasks)
            if native is None:
                compile_object(module, job.chunk.public[0], job.path, job.opt_level)
        except NativeError:
            # ops the passes left unlowered, named (checked only here: a walk of every op in
            # Python, 35 ms of a 16x256 Adam step's build)
            check_lowered_to_llvm(module, job.tail)
            raise
        # a step's only chunk keeps its names (0.7 s of matching for the autoencoder)
        if printed is None or job.chunk.whole:
            return printed, native
        return rename(printed, internal, job.chunk.public[0]), native


def _prepare(module: ir.Module, job: Job) -> list[str]:
    """The LLVM-dialect edits before LLVM compiles ``job``'s lowered ``module``; returns the
    names it made internal (``localize``)."""
    if job.chunk.step:
        pass_pointers(module, job.chunk.step)
    internal = localize(module, job.chunk.public)
    mark_kernels(module, job.chunk.kernels)
    schedule_worksharing_loops(module, (*job.chunk.kernels, job.chunk.step))
    inline_step(module, job.chunk.step)
    if job.opt_level == 0 and job.chunk.step and job.chunk.kernels:
        select_fast(module, job.chunk.public[0])
    if job.opt_level > 0:  # at -O0 nothing vectorizes (host_cpu's gathers): the JIT's host target
        tune_for_host(module)  # serves, without waiting for the host's probe (two LLVM tools run)
    return internal


def compile_resident_split(step: Job, kernels: Job, context: ir.Context) -> NativeFunction | None:
    """A split step compiled on two cores into this process's JIT: the ``kernels`` chunk (every
    kernel) lowered here, then compiled in an engine of MLIR's (``engine_capi``: without the GIL)
    on a thread, while the ``step`` chunk (the step alone, which calls them through
    ``kernel_slots``, filled once both are compiled) is lowered here and compiled with LLVM's code
    generator at -O0 (``llvm_jit``). Both lowered in ``context``. None when either calls a
    function that is not loaded in this process (as ``native.compile_in_memory``)."""
    kernels_module = lower_chunk(kernels, context)
    with context:
        _prepare(kernels_module, kernels)
    if not calls_only_loaded(kernels_module):
        return None
    addresses: dict[str, int] = {}
    failed: list[NativeError] = []

    def compile_kernels() -> None:
        try:
            addresses.update((name, engine.lookup(name)) for name in kernels.chunk.kernels)
        except NativeError as error:
            failed.append(error)

    modules = [kernels_module]
    try:
        with interrupts_deferred():  # the modules outlive their translations (see support.interrupts)
            # translated here: MLIR is used by this thread only; the other compiles the LLVM module
            engine = Engine(kernels_module, kernels.opt_level, "kernels")
            other = threading.Thread(target=compile_kernels, name="mlir_nn-jit", daemon=True)
            other.start()
            try:
                compiled = _compile_step(step, context, modules)
            finally:
                other.join()
        if failed:
            raise failed[0]
    except NativeError:
        for module, job in zip(modules, (kernels, step)):  # ops the passes left unlowered, named
            check_lowered_to_llvm(module, job.tail)
        raise
    if compiled is None:
        return None
    jit, entry, slots = compiled
    for name, slot in slots.items():
        ctypes.c_void_p.from_address(jit.lookup(slot)).value = addresses[name]
    return NativeFunction(entry, (jit, engine), "_mlir_" + step.chunk.public[0])


def _compile_step(step: Job, context: ir.Context, modules: list[ir.Module]) -> tuple[Jit, int, dict[str, str]] | None:
    """``step``'s chunk lowered (appended to ``modules``) and compiled at -O0 (``llvm_jit``): the
    JIT, its packed entry point and its kernels' slots; None when it calls a function that is not
    loaded in this process."""
    module = lower_chunk(step, context)
    modules.append(module)
    with context:
        _prepare(module, step)
        slots = kernel_slots(module, step.chunk.calls)
        entry = packed_interface(module, step.chunk.public[0])
    if not calls_only_loaded(module):
        return None
    jit = Jit(module, step.chunk.step)
    return jit, jit.lookup(entry), slots


def packed_interface(module: ir.Module, interface: str) -> str:
    """Add to the LLVM-dialect ``module`` the packed entry point of its function ``interface``,
    as MLIR's ExecutionEngine makes it: ``void _mlir_<interface>(void **args)``, ``args[i]``
    pointing at the i-th argument. Returns its name."""
    (function,) = [op.operation for op in module.body.operations
                   if op.operation.name == "llvm.func" and symbol(op.operation) == interface]
    parameters = _parameters(str(ir.TypeAttr(function.attributes["function_type"]).value), interface)
    lines = [f"llvm.func @{interface}({', '.join(parameters)})",  # (declared for the parse only)
             f"llvm.func @_mlir_{interface}(%args: !llvm.ptr) {{"]
    for i, kind in enumerate(parameters):
        lines += [f"  %p{i} = llvm.getelementptr %args[{i}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr",
                  f"  %q{i} = llvm.load %p{i} : !llvm.ptr -> !llvm.ptr",
                  f"  %a{i} = llvm.load %q{i} : !llvm.ptr -> {kind}"]
    values = ", ".join(f"%a{i}" for i in range(len(parameters)))
    lines += [f"  llvm.call @{interface}({values}) : ({', '.join(parameters)}) -> ()", "  llvm.return", "}"]
    parsed = ir.Module.parse("\n".join(lines))
    module.body.append(list(parsed.body.operations)[-1].operation)
    return f"_mlir_{interface}"


SLOT_PREFIX = "mlirnn_slot_"


def kernel_slots(module: ir.Module, kernels: Collection[str]) -> dict[str, str]:
    """Each declaration of ``kernels`` in the LLVM-dialect ``module`` made a function that calls
    the address in a global of its own (named ``SLOT_PREFIX`` + the kernel, null until filled):
    the kernels compiled in another engine, whose addresses the first engine cannot know when it
    links. Returns each kernel's global."""
    slots = {}
    for op in [op.operation for op in module.body.operations]:
        if op.name != "llvm.func" or op.regions[0].blocks or symbol(op) not in kernels:
            continue
        name = symbol(op)
        parameters = _parameters(str(ir.TypeAttr(op.attributes["function_type"]).value), name)
        arguments = ", ".join(f"%a{i}: {t}" for i, t in enumerate(parameters))
        values = ", ".join(f"%a{i}" for i in range(len(parameters)))
        slots[name] = SLOT_PREFIX + name
        text = (f"llvm.mlir.global external @{slots[name]}() {{addr_space = 0 : i32}} : !llvm.ptr {{\n"
                "  %0 = llvm.mlir.zero : !llvm.ptr\n  llvm.return %0 : !llvm.ptr\n}\n"
                f"llvm.func internal @{name}({arguments}) {{\n"
                f"  %slot = llvm.mlir.addressof @{slots[name]} : !llvm.ptr\n"
                "  %kernel = llvm.load %slot : !llvm.ptr -> !llvm.ptr\n"
                f"  llvm.call %kernel({values}) : !llvm.ptr, ({', '.join(parameters)}) -> ()\n"
                "  llvm.return\n}")
        parsed = ir.Module.parse(text)
        for definition in list(parsed.body.operations):
            definition.operation.move_before(op)
        op.erase()
    return slots


def _parameters(function_type: str, name: str) -> list[str]:
    """The parameter types of the function ``name`` of type ``!llvm.func<void (...)>``, which
    takes scalars and pointers only (a kernel takes its memrefs as pointers and sizes, a C
    interface as pointers to descriptors) and returns nothing."""
    match = re.fullmatch(r"!llvm\.func<void \(([\w, ]*)\)>", function_type)
    if match is None:
        raise NativeError(f"function {name} has the type {function_type}, not one taking scalars and "
                          "pointers and returning nothing")
    return ["!llvm.ptr" if t == "ptr" else t for t in match.group(1).split(", ") if t]


def warm_up() -> None:
    """Compile a trivial function: LLVM initializes its targets once per process."""
    with tempfile.TemporaryDirectory() as tmp, ir.Context():
        module = ir.Module.parse("llvm.func @warm_up() {\n  llvm.return\n}")
        compile_object(module, "warm_up", Path(tmp) / "warm_up.o")


_SYMBOL = re.compile(r"@([\w$.]+)")


def _top_level_ops(text: str) -> list[str]:
    """The texts of a printed module's top-level ops (each starts at two spaces of indent, where
    only the closing braces and block labels of function bodies are printed besides)."""
    body = text[text.index("module {") + len("module {"):text.rindex("}")]
    ops: list[list[str]] = []
    for line in body.strip("\n").splitlines():
        if line.startswith("  ") and not line.startswith(("   ", "  }", "  ^")):
            ops.append([line])
        elif ops:
            ops[-1].append(line)
    return ["\n".join(lines) for lines in ops]


def merge_texts(texts: list[str]) -> str:
    """One LLVM-dialect module holding every definition of ``texts`` (the chunks of a step) and
    one declaration of each function they call but none defines."""
    definitions: dict[str, str] = {}
    declarations: dict[str, str] = {}
    for text in texts:
        for op in _top_level_ops(text):
            found = _SYMBOL.search(op)
            name = found.group(1) if found else op
            (definitions if "\n" in op or op.startswith("  llvm.mlir.global") else declarations)[name] = op
    kept = list(definitions.values()) + [op for name, op in declarations.items() if name not in definitions]
    return "module {\n" + "\n".join(kept) + "\n}\n"


def reaching(text: str, roots: Collection[str]) -> str:
    """The printed LLVM-dialect module ``text`` cut down to what the functions ``roots`` use."""
    ops: dict[str, str] = {}
    for op in _top_level_ops(text):
        found = _SYMBOL.search(op)
        ops[found.group(1) if found else op] = op
    kept: set[str] = set()
    todo = [name for name in roots if name in ops]
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo.extend(n for n in _SYMBOL.findall(ops[name]) if n in ops and n not in kept)
    return "module {\n" + "\n".join(op for name, op in ops.items() if name in kept) + "\n}\n"


def kernels_only(text: str, kernels: Collection[str]) -> str:
    """Of the LLVM text of a compiled chunk, what ``kernels`` use, every other definition
    renamed after the first kernel: the part of a cached object's text that a step which links
    it merges with its own (``merge_texts``; the objects that it links share no kernel)."""
    kept = reaching(text, kernels)
    defined = (_SYMBOL.search(op) for op in _top_level_ops(kept) if "\n" in op or "llvm.mlir.global" in op)
    return rename(kept, [m.group(1) for m in defined if m and m.group(1) not in kernels], min(kernels))
