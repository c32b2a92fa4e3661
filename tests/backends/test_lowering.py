"""run_pipeline verifies what mlir-nn's own code hands the passes (not every pass's output): the
module it gets, and each hook's output when ``MLIR_NN_VERIFY=1`` (the test suite's setting) or
when the pipeline failed."""

from __future__ import annotations

import pytest
from mlir import ir

from mlir_nn.backends.lowering import VERIFY_VARIABLE, LoweringError, run_pipeline, verify_hooks
from mlir_nn.support.pipelines import Pipeline

_MODULE = "func.func @f() -> i32 {\n  %c = arith.constant 1 : i32\n  return %c : i32\n}"
PIPELINE = Pipeline("test", ("canonicalize", "cse", "symbol-dce"))
# an op without a bufferization: one-shot-bufferize fails on it
_UNBUFFERIZABLE = ("func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                   "  %b = builtin.unrealized_conversion_cast %a : tensor<4xf32> to tensor<4xf32>\n"
                   "  return %b : tensor<4xf32>\n}")


def _drop_terminator(module: ir.Module) -> None:
    """A broken hook: the function's block loses its return."""
    block = module.body.operations[0].regions[0].blocks[0]
    list(block.operations)[-1].erase()


def _wrong_result_type(module: ir.Module) -> None:
    """A broken hook that the passes below do not notice: the function's type no longer matches its return."""
    function = module.body.operations[0]
    function.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([], [ir.F32Type.get()]))


def test_with_verify_a_hook_that_leaves_invalid_ir_is_named_before_the_pass_it_precedes(monkeypatch):
    monkeypatch.setenv(VERIFY_VARIABLE, "1")
    with ir.Context():
        module = ir.Module.parse(_MODULE)
        with pytest.raises(LoweringError, match=r"(?s)invalid before pass 2 'cse'.*no terminator"):
            run_pipeline(module, PIPELINE, {"cse": _drop_terminator})


def test_by_default_only_the_module_as_given_is_verified(monkeypatch):
    monkeypatch.delenv(VERIFY_VARIABLE, raising=False)
    with ir.Context():
        broken = ir.Module.parse(_MODULE)
        _drop_terminator(broken)
        with pytest.raises(LoweringError, match=r"(?s)invalid before pass 1 'canonicalize'.*no terminator"):
            run_pipeline(broken, PIPELINE)
        module = ir.Module.parse(_MODULE)
        assert run_pipeline(module, PIPELINE, {"cse": _wrong_result_type}) == PIPELINE.passes


def test_a_failed_pipeline_names_a_hooks_invalid_output(monkeypatch):
    monkeypatch.delenv(VERIFY_VARIABLE, raising=False)
    pipeline = Pipeline("test", ("symbol-dce", "one-shot-bufferize"))

    def wrong_argument_type(module: ir.Module) -> None:
        tensor = ir.Type.parse("tensor<4xf32>")
        function = module.body.operations[0]
        function.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([ir.F32Type.get()], [tensor]))

    with ir.Context():
        with pytest.raises(LoweringError, match=r"invalid before pass 2 'one-shot-bufferize'"):
            run_pipeline(ir.Module.parse(_UNBUFFERIZABLE), pipeline, {"one-shot-bufferize": wrong_argument_type})
        with pytest.raises(LoweringError, match=r"(?s)pass 2 'one-shot-bufferize' failed.*not bufferized"):
            run_pipeline(ir.Module.parse(_UNBUFFERIZABLE), pipeline, {"one-shot-bufferize": lambda m: None})


def test_the_verify_setting_is_checked(monkeypatch):
    monkeypatch.setenv(VERIFY_VARIABLE, "yes")
    with pytest.raises(ValueError, match="MLIR_NN_VERIFY must be 0 or 1"):
        verify_hooks()
    monkeypatch.setenv(VERIFY_VARIABLE, "1")
    assert verify_hooks()


def test_valid_hooks_run_every_pass():
    with ir.Context():
        module = ir.Module.parse(_MODULE)
        assert run_pipeline(module, PIPELINE, {"cse": lambda m: None}) == PIPELINE.passes
        assert "arith.constant 1" in str(module)
