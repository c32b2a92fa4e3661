"""The shipped pipelines: what their order must keep."""

from __future__ import annotations

from mlir_nn.support.pipelines import load_pipeline


def test_the_cpu_pipeline_runs_cse_only_once_bufferized():
    """cse before one-shot-bufferize merged every tensor.empty of a type into one: the outputs
    of all products of that shape became one alias set, which both bufferization analyses
    checked pair by pair (quadratic in a deep MLP's layers)."""
    passes = [p.split("{")[0] for p in load_pipeline("cpu").passes]
    bufferize = passes.index("one-shot-bufferize")
    assert "eliminate-empty-tensors" in passes[:bufferize]
    assert "cse" not in passes[:bufferize] and "cse" in passes[bufferize + 1:]
