"""Run a pass pipeline over a module; on failure, name the failing pass and the op location."""

from __future__ import annotations

from mlir import ir
from mlir.passmanager import PassManager

from mlir_nn.pipelines import Pipeline


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


def run_pipeline(module: ir.Module, pipeline: Pipeline) -> None:
    """Lower ``module`` in place. On failure, rerun pass by pass on a copy to find the culprit."""
    source = str(module)
    try:
        with module.context:
            PassManager.parse(pipeline.as_mlir()).run(module.operation)
        return
    except ir.MLIRError as error:
        whole = _diagnostics(error)
    except ValueError as error:  # the pipeline text itself does not parse
        raise LoweringError(f"pipeline {pipeline.name} does not parse: {error}") from None
    with ir.Context() as context:
        probe = ir.Module.parse(source)
        for i, name in enumerate(pipeline.passes, 1):
            try:
                PassManager.parse("builtin.module(" + name + ")", context).run(probe.operation)
            except ir.MLIRError as error:
                raise LoweringError(
                    f"pipeline {pipeline.name}: pass {i} '{name}' failed:\n{_diagnostics(error)}"
                ) from None
    raise LoweringError(f"pipeline {pipeline.name} failed:\n{whole}")
