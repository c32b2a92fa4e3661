"""One module of a split step (a kernel, or the step that calls them) to an object file.

The module runs the rest of the pipeline (from ``kernel_split.SPLIT_PASS`` on) by itself,
then LLVM compiles it. Functions that the lowering added to a kernel (the bodies and
dispatchers of its parallel loops) are renamed after the kernel and made internal, so the
objects of many kernels link into one shared object, and their LLVM texts into one module.
Runs in the compiling process or in a worker (``kernel_pool``); imports MLIR.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlir import ir

from mlir_nn.backends.kernel_split import NOALIAS, Chunk
from mlir_nn.backends.lowering import check_lowered_to_llvm, run_pipeline
from mlir_nn.backends.native import compile_object
from mlir_nn.codegen.copies import strided_copies_as_loops
from mlir_nn.codegen.lane_loads import scalarize_lane_loads
from mlir_nn.support.pipelines import Pipeline

_DEFINITIONS = ("llvm.func", "llvm.mlir.global")


@dataclass(frozen=True)
class Job:
    """Compile ``chunk`` with ``tail`` (the pipeline's passes from the split on) into ``path``."""

    chunk: Chunk
    tail: Pipeline
    path: Path


def lower_tail(module: ir.Module, tail: Pipeline) -> None:
    """The pipeline's passes from the split on, with the hooks the cpu backend runs there."""
    run_pipeline(module, tail, {"convert-linalg-to-loops": strided_copies_as_loops})
    scalarize_lane_loads(module)


def _name(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _is_definition(op: ir.Operation) -> bool:
    if op.name == "llvm.func":
        return bool(op.regions[0].blocks)
    return op.name == "llvm.mlir.global" and ("value" in op.attributes or bool(op.regions[0].blocks))


def localize(module: ir.Module, public: tuple[str, ...], rename: bool = True) -> ir.Module:
    """``module`` with every definition but ``public`` internal and, with ``rename``, renamed
    ``<first public>_<name>`` (the first public name is unique: a kernel's hash, or the step's
    name), so that the LLVM texts of chunks merge into one module. Renamed in the text, which
    is parsed again: renaming symbol by symbol walks the whole module each time. A step's only
    chunk keeps its names (0.7 s of printing, matching and parsing for the autoencoder)."""
    internal = ir.Attribute.parse("#llvm.linkage<internal>")
    names = []
    for op in [op.operation for op in module.body.operations]:
        if op.name in _DEFINITIONS and _is_definition(op) and _name(op) not in public:
            names.append(_name(op))
            op.attributes["linkage"] = internal
    if not names or not rename:
        return module
    pattern = re.compile("@(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w$.])")
    return ir.Module.parse(pattern.sub(lambda m: f"@{public[0]}_{m.group(1)}", str(module)), module.context)


def mark_kernels(module: ir.Module, kernels: tuple[str, ...]) -> None:
    """Kernels stay functions of their own (LLVM would inline each into the step, and keep
    it too); ``noalias`` on their pointer arguments that ``kernel_split`` found unshared."""
    for op in [op.operation for op in module.body.operations]:
        if op.name != "llvm.func" or _name(op) not in kernels or not op.regions[0].blocks:
            continue
        op.attributes["no_inline"] = ir.UnitAttr.get()
        if NOALIAS not in op.attributes:
            continue
        marked = set(ir.DenseI64ArrayAttr(op.attributes[NOALIAS]))
        count = len(op.regions[0].blocks[0].arguments)
        op.attributes["arg_attrs"] = ir.ArrayAttr.get(
            [ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()} if i in marked else {}) for i in range(count)])


def build(job: Job) -> str:
    """Lower and compile ``job``; returns the module's LLVM-dialect text."""
    with ir.Context():
        module = ir.Module.parse(job.chunk.text)
        lower_tail(module, job.tail)
        check_lowered_to_llvm(module, job.tail)
        module = localize(module, job.chunk.public, rename=not job.chunk.whole)
        mark_kernels(module, job.chunk.public)
        text = str(module)
        compile_object(module, job.chunk.public[0], job.path, job.chunk.calls)
    return text


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
