"""Blocked products prefetch the next row panel's slice of A in their register kernels.

The prefetches are hints (results cannot show them): the bufferized step is read instead.
Every unrolled register-kernel loop prefetches, per iteration, exactly the cache lines of A
it reads, of the next row panel (clamped to the task's last), into L2; products keep
matching the reference (``test_cpu_matmul``), here also with one row panel per task.
"""

from __future__ import annotations

import numpy as np
import pytest
from mlir import ir

from mlir_nn.backends.cpu import CpuBackend, lower_with_plan
from mlir_nn.backends.reference import evaluate
from mlir_nn.codegen.panel_prefetch import K_LOOP, L2_LOCALITY, LINE_BYTES
from mlir_nn.codegen.walk import collect_ops
from mlir_nn.support.cpu_target import register_block
from mlir_nn.support.pipelines import load_pipeline
from tests.codegen.zoo import arguments, matmul_zoo


def _prefetches(loop: ir.Operation) -> list[ir.Operation]:
    return [op for op in loop.regions[0].blocks[0].operations if op.name == "memref.prefetch"]


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("float64", 8)])
def test_each_register_kernel_prefetches_its_lines_of_the_next_row_panel(dtype, itemsize):
    module, _, _, _, split, _ = lower_with_plan(matmul_zoo(600, 517, dtype), load_pipeline("cpu"))
    with module.context:  # the kernels the step was split into, as they are lowered on their own
        kernels = [ir.Module.parse(text) for text in split.kernels.values()]
    loops = [loop for kernel in kernels
             for loop in collect_ops(kernel, lambda op: op.name == "scf.for" and K_LOOP in op.attributes)]
    assert any(_prefetches(loop) for loop in loops)
    tm = register_block(itemsize)[0]
    for loop in loops:
        unroll = ir.IntegerAttr(loop.operands[2].owner.attributes["value"]).value
        prefetches = _prefetches(loop)
        read = unroll * tm * itemsize  # bytes of A per iteration: prefetched only when whole lines
        assert len(prefetches) == (read // LINE_BYTES if read % LINE_BYTES == 0 else 0)
        for op in prefetches:
            assert ir.MemRefType(op.operands[0].type).shape[2] == tm  # the task's row panels [panels, k, tm]
            assert ir.IntegerAttr(op.attributes["localityHint"]).value == L2_LOCALITY
            assert "isWrite" not in op.attributes or not ir.BoolAttr(op.attributes["isWrite"]).value
            panel = op.operands[1].owner
            assert panel.name == "arith.minsi"  # the next panel, at most the last
            row = loop.parent.regions[0].blocks[0].arguments[0]
            assert panel.operands[0].owner.name == "arith.addi" and panel.operands[0].owner.operands[0] == row


@pytest.mark.parametrize("rows", [1, 7, 13, 257])
def test_products_whose_tasks_have_one_or_many_row_panels_match_the_reference(rows):
    graph = matmul_zoo(600, 64, "float32")
    executable = CpuBackend().compile(graph)
    assert "llvm.intr.prefetch" in executable.stages["llvm"]
    inputs, params = arguments(graph, rows, np.random.default_rng(rows))
    want, _ = evaluate(graph, inputs, [p.copy() for p in params], rows)
    for node, got, expected in zip(graph.outputs, executable.run(inputs, params), want):
        np.testing.assert_allclose(got, expected, rtol=3e-4, atol=3e-4, err_msg=f"{node.op} {dict(node.attrs)}")
