"""linalg ops built without MLIR's op DSL are the ops ``mlir.dialects.linalg`` builds, and a
compile never imports that module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlir import ir
from mlir.dialects import arith, func, tensor

from mlir_nn.codegen import linalg_ops
from mlir_nn.codegen.maps import identity_map, matmul_maps

ROOT = Path(__file__).resolve().parents[2]


def _build(linalg: object) -> str:
    """A function using every op of ``linalg_ops``, built with ``linalg``; its generic form."""
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.create()
        f32, f64 = ir.F32Type.get(), ir.F64Type.get()
        buffer = ir.MemRefType.get([3, 7], f32)
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(ir.RankedTensorType.get([3, 7], f32), ir.RankedTensorType.get([7, 5], f32),
                                      buffer, buffer)
            def step(a, b, x, y):
                zeros = linalg.fill(arith.constant(f32, 0.0), outs=[tensor.empty([3, 5], f32)])
                product = linalg.matmul(a, b, outs=[zeros])
                square = linalg.matmul(a, a, outs=[tensor.empty([3, 3], f32)], indexing_maps=matmul_maps(False, True))
                copied = linalg.copy(a, outs=[tensor.empty([3, 7], f32)])
                linalg.copy(x, outs=[y])
                linalg.fill(arith.constant(f32, 1.0), outs=[x])

                @linalg.generic([a], [tensor.empty([3], f64)], [identity_map(2), ir.AffineMap.get(2, 0, [
                    ir.AffineDimExpr.get(0)])], [linalg.IteratorType.parallel, linalg.IteratorType.reduction])
                def widened(v, acc):
                    linalg.IndexOp(1)
                    return arith.addf(acc, arith.extf(f64, v))

                return product, square, copied, widened
        assert module.operation.verify()
        return module.operation.get_asm(print_generic_op_form=True)


def test_the_ops_are_those_of_the_op_dsl():
    from mlir.dialects import linalg

    ours = _build(linalg_ops)
    assert ours == _build(linalg)
    for op in ("linalg.fill", "linalg.matmul", "linalg.copy", "linalg.generic", "linalg.index", "cast_signed"):
        assert op in ours


@pytest.mark.parametrize("tier", ["native", "off"])
def test_a_cold_compile_never_imports_the_op_dsl_and_it_still_imports_whole(tier, tmp_path):
    """A fresh process compiles a step (the native first tier, or the optimized code with its
    compile workers) without ``mlir.dialects.linalg``; importing it afterwards gives the whole
    module, whose ops build as before."""
    program = """
import json, sys
import numpy as np
import mlir_nn
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import train_step
np.random.seed(0)
model = MLP(5, [9, 9, 3])
step = mlir_nn.jit(train_step(model, Adam(model.parameters(), lr=1e-3), mse_loss))
x, y = np.ones((7, 5), np.float32), np.ones((7, 3), np.float32)
loss = float(step(x, y))
loaded = sorted(m for m in sys.modules if m.startswith("mlir.dialects.linalg"))
from mlir import ir
from mlir.dialects import arith, linalg, tensor
with ir.Context(), ir.Location.unknown():
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        linalg.fill(arith.constant(ir.F32Type.get(), 0.0), outs=[tensor.empty([2], ir.F32Type.get())])
    built = module.operation.verify() and hasattr(linalg, "batch_matmul")
print(json.dumps({"tier": step._last.tier, "loss": loss, "loaded": loaded, "built": built}))
"""
    settings = {"native": {"MLIR_NN_TIERED": "1", "MLIR_NN_FIRST_TIER": "native"}, "off": {"MLIR_NN_TIERED": "0"}}
    env = dict(os.environ, MLIR_NN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT), **settings[tier])
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["tier"] == {"native": "quick", "off": "cpu"}[tier] and report["loss"] > 0
    assert report["loaded"] == [] and report["built"]
