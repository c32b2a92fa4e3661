"""The buffer-deallocation passes run only when the memory plan leaves a heap buffer.

A step whose buffers all became workspace views skips them (they took 0.3 to 0.5 s of a deep
MLP's build); one that keeps heap buffers still frees every one of them.
"""

from __future__ import annotations

import re

import numpy as np
from mlir import ir

from mlir_nn.backends.cpu import PLAN_PASS, CpuBackend, lower, lower_with_plan, tail_pipeline
from mlir_nn.backends.lowering import run_pipeline
from mlir_nn.backends.memory_plan import needs_deallocation, plan_memory
from mlir_nn.backends.reference import evaluate
from mlir_nn.support.pipelines import Pipeline, load_pipeline
from tests.backends.test_memory_plan import allocating_functions
from tests.codegen.zoo import arguments, matmul_zoo


def _calls(text: str, *callees: str) -> int:
    return sum(len(re.findall(rf"llvm\.call @{callee}\(", text)) for callee in callees)


ALLOCATE = ("malloc", "aligned_alloc")


def test_a_step_that_keeps_heap_buffers_frees_every_one():
    """A buffer the plan cannot place (its size is not made from the batch size) stays on the
    heap, the step then needs the deallocation passes, and they free it. (No traced step keeps
    one since the plan took loops' buffers too: this step is written in MLIR.)"""
    step = """func.func @step(%x: memref<?xf32>, %n: index) attributes {llvm.emit_c_interface} {
      %c0 = arith.constant 0 : index
      %buffer = memref.alloc(%n) : memref<?xf32>
      %v = memref.load %x[%c0] : memref<?xf32>
      memref.store %v, %buffer[%c0] : memref<?xf32>
      %w = memref.load %buffer[%c0] : memref<?xf32>
      memref.store %w, %x[%c0] : memref<?xf32>
      return
    }"""
    pipeline = load_pipeline("cpu")
    with ir.Context():
        module = ir.Module.parse(step)
        plan, _ = plan_memory(module, {(0, 0)})
        assert plan.heap_buffers == 1 and needs_deallocation(module)
        run_pipeline(module, Pipeline("tail", pipeline.passes[pipeline.passes.index(PLAN_PASS):]), {})
        text = str(module)
    assert _calls(text, *ALLOCATE) == 1 and _calls(text, "free") == 1


def test_a_step_without_heap_buffers_skips_the_deallocation_passes():
    graph = matmul_zoo(8, 8, "float32")
    pipeline = load_pipeline("cpu")
    *_, plan, _, passes = lower_with_plan(graph, pipeline)
    assert plan is not None and plan.heap_buffers == 0
    assert PLAN_PASS not in passes and "convert-bufferization-to-memref" in passes
    head = pipeline.passes[:len(pipeline.passes) - len(tail_pipeline(pipeline).passes)]  # the split step's
    assert passes == tuple(p for p in head if p != PLAN_PASS)  # kernels run the tail each
    text = lower(graph, pipeline)[1]["llvm"]
    assert not allocating_functions(text)
    executable = CpuBackend().compile(graph)
    inputs, params = arguments(graph, 7, np.random.default_rng(0))
    want, _ = evaluate(graph, inputs, [p.copy() for p in params], 7)
    for got, expected in zip(executable.run(inputs, params), want):
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


# what buffer-deallocation-pipeline runs, spelled out pass by pass (after the skipped pass itself)
DEALLOCATION = ("expand-realloc{emit-deallocs=false}", "canonicalize", "ownership-based-buffer-deallocation",
                "canonicalize", "buffer-deallocation-simplification", "bufferization-lower-deallocations", "cse",
                "canonicalize")


def _ops(text: str) -> list[str]:
    """The lines of an LLVM-dialect text without value names (nor the numbers of the assert
    messages, counted over the process), in order: the same ops, the constants maybe in
    another order."""
    return sorted(re.sub(r"%[\w#]+|@assert_msg_\d+", "%", line) for line in text.splitlines())


def test_skipping_the_deallocation_passes_leaves_the_same_llvm_input():
    """The clean-up the skipped pipeline did (its last cse and canonicalize) is kept: the step
    lowers to the same LLVM ops as when the deallocation passes run."""
    pipeline = load_pipeline("cpu")
    at = pipeline.passes.index(PLAN_PASS)
    spelled = Pipeline("spelled", pipeline.passes[:at + 1] + DEALLOCATION + pipeline.passes[at + 1:])
    graph = matmul_zoo(64, 64, "float32")  # blocked products (canonicalize, then cse, left more)
    assert _ops(lower(graph, pipeline)[1]["llvm"]) == _ops(lower(graph, spelled)[1]["llvm"])


def test_only_heap_allocations_need_deallocation():
    with ir.Context():
        stack = ir.Module.parse("func.func @f() { %a = memref.alloca() : memref<4xf32>\n return }")
        heap = ir.Module.parse("func.func @f(%n: index) { %a = memref.alloc(%n) : memref<?xf32>\n return }")
        assert not needs_deallocation(stack) and needs_deallocation(heap)


def test_a_hook_that_answers_true_skips_the_pass_it_runs_before():
    pipeline = Pipeline("test", ("canonicalize", "cse", "symbol-dce"))
    with ir.Context():
        module = ir.Module.parse("func.func private @unused() \n func.func @f() { return }")
        ran = run_pipeline(module, pipeline, {"cse": lambda m: True, "symbol-dce": lambda m: None})
        assert ran == ("canonicalize", "symbol-dce")
        assert "@unused" not in str(module)  # the pass after the skipped one ran
