"""Run a pass pipeline over a module; on failure, name the failing pass and the op location."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mlir import ir
from mlir.passmanager import PassManager

from mlir_nn.support.pipelines import Pipeline
from mlir_nn.support.switches import switch


class LoweringError(RuntimeError):
    """A pass pipeline failed; the message names the pass and the diagnostics."""


def _diagnostics(error: Exception) -> str:
    details = getattr(error, "error_diagnostics", None)
    if not details:
        return str(error)
    lines = []
    for d in details:
        lines.append(f"{d.location}: {d.message}")
        lines.extend(f"  {n.location}: {n.message}" for n in d.notes)
    return "\n".join(lines)


Hook = Callable[[ir.Module], bool | None]  # True: skip the pass it runs before
VERIFY_VARIABLE = "MLIR_NN_VERIFY"


def verify_hooks() -> bool:
    """``$MLIR_NN_VERIFY`` is 1: the module is verified after every hook too (debugging and the
    test suite), not only as ``run_pipeline`` gets it. Anything but 0 or 1 is a ValueError."""
    return switch(VERIFY_VARIABLE, False, "1: verify the module after every hook of a pass pipeline")


def run_pipeline(module: ir.Module, pipeline: Pipeline, hooks: Mapping[str, Hook] | None = None,
                 verified: bool = False) -> tuple[str, ...]:
    """Lower ``module`` in place; the passes run. ``hooks`` maps a pass name to a function
    run on the module right before the first pass whose name starts with it; one that returns
    True skips that pass. The module is verified as it comes (what mlir-nn's code generator
    made), not after every pass (MLIR's default: a fifth of the pass time of a deep MLP's step),
    nor after each hook unless ``verify_hooks()`` (25 ms each at 16x256 Adam, five per step); on
    failure, a rerun pass by pass on a copy, verifying each pass and hook, finds the culprit.
    ``verified``: the module is known valid as it comes (just parsed), its first check is skipped.
    The copy is a clone taken up front (a tenth of the time of printing the module, which a
    step of a few hundred kernels took 0.15 s for)."""
    original = module.operation.clone()
    hooks = hooks or {}
    cuts = sorted({next(i for i, p in enumerate(pipeline.passes) if p.startswith(name)): hook
                   for name, hook in hooks.items() if any(p.startswith(name) for p in pipeline.passes)}.items())
    bounds = [0] + [i for i, _ in cuts] + [len(pipeline.passes)]
    every = verify_hooks()
    ran: list[str] = []
    try:
        with module.context:
            for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
                if k > 0 and cuts[k - 1][1](module) is True:
                    lo += 1
                if hi > lo:
                    if (k == 0 and not verified) or every:
                        _verify(module, pipeline, lo)
                    manager = PassManager.parse("builtin.module(" + ",".join(pipeline.passes[lo:hi]) + ")")
                    manager.enable_verifier(False)
                    manager.run(module.operation)
                    ran.extend(pipeline.passes[lo:hi])
        return tuple(ran)
    except ir.MLIRError as error:
        whole = _diagnostics(error)
    except ValueError as error:  # the pipeline text itself does not parse: one line saying where
        first, *rest = str(error).strip().splitlines() or [""]
        where = f" in {rest[0].strip()!r}" if rest else ""
        raise LoweringError(f"pipeline {pipeline.name} does not parse: {first.split('error: ', 1)[-1]}{where}") \
            from None
    with ir.Context() as context:
        probe = ir.Module.parse(str(original))
        starts = dict(cuts)
        for i, name in enumerate(pipeline.passes, 1):
            if i - 1 in starts:
                if starts[i - 1](probe) is True:
                    continue
                _verify(probe, pipeline, i - 1)
            try:
                PassManager.parse("builtin.module(" + name + ")", context).run(probe.operation)
            except ir.MLIRError as error:
                raise LoweringError(
                    f"pipeline {pipeline.name}: pass {i} '{name}' failed:\n{_diagnostics(error)}"
                ) from None
    raise LoweringError(f"pipeline {pipeline.name} failed:\n{whole}")


def _verify(module: ir.Module, pipeline: Pipeline, index: int) -> None:
    """Check the module that pass ``index`` is about to get (what the code generator and the
    hooks made of it); a LoweringError that says so when it is invalid."""
    try:
        module.operation.verify()
    except ir.MLIRError as error:
        raise LoweringError(f"pipeline {pipeline.name}: the module is invalid before pass {index + 1} "
                            f"'{pipeline.passes[index]}':\n{_diagnostics(error)}") from None


def non_llvm_ops(module: ir.Module) -> list[str]:
    """Names of ops that the LLVM translation cannot take (anything outside the llvm dialect and
    OpenMP's, whose parallel loops it outlines: the threaded loops, ``task_runtime``)."""
    found: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        if not op.name.startswith(("llvm.", "omp.")) and op.name != "builtin.module":
            found.add(op.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return sorted(found)


def check_lowered_to_llvm(module: ir.Module, pipeline: Pipeline) -> None:
    leftover = non_llvm_ops(module)
    if leftover:
        raise LoweringError(f"pipeline {pipeline.name} did not lower everything to the LLVM dialect; "
                            f"left: {', '.join(leftover[:8])}")
