"""run_pipeline verifies what mlir-nn's own code hands the passes (not every pass's output)."""

from __future__ import annotations

import pytest
from mlir import ir

from mlir_nn.backends.lowering import LoweringError, run_pipeline
from mlir_nn.support.pipelines import Pipeline

_MODULE = "func.func @f() -> i32 {\n  %c = arith.constant 1 : i32\n  return %c : i32\n}"
PIPELINE = Pipeline("test", ("canonicalize", "cse", "symbol-dce"))


def _drop_terminator(module: ir.Module) -> None:
    """A broken hook: the function's block loses its return."""
    block = module.body.operations[0].regions[0].blocks[0]
    list(block.operations)[-1].erase()


def test_a_hook_that_leaves_invalid_ir_is_named_before_the_pass_it_precedes():
    with ir.Context():
        module = ir.Module.parse(_MODULE)
        with pytest.raises(LoweringError, match=r"(?s)invalid before pass 2 'cse'.*no terminator"):
            run_pipeline(module, PIPELINE, {"cse": _drop_terminator})


def test_valid_hooks_run_every_pass():
    with ir.Context():
        module = ir.Module.parse(_MODULE)
        assert run_pipeline(module, PIPELINE, {"cse": lambda m: None}) == PIPELINE.passes
        assert "arith.constant 1" in str(module)
