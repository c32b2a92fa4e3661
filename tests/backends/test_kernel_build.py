"""Building one chunk of a split step: its LLVM text, and ops the passes left unlowered named."""

from __future__ import annotations

import pytest
from mlir import ir

from mlir_nn.backends.kernel_build import Job, build
from mlir_nn.backends.kernel_split import Chunk
from mlir_nn.backends.lowering import LoweringError
from mlir_nn.support.pipelines import Pipeline

_LOWERED = "module {\n  llvm.func @k(%a: i64) -> i64 {\n    llvm.return %a : i64\n  }\n}\n"
_NOT_LOWERED = ("module {\n  llvm.func @k(%a: i64) -> i64 {\n    %b = arith.addi %a, %a : i64\n"
                "    llvm.return %b : i64\n  }\n}\n")


def test_a_chunk_compiles_to_an_object_and_returns_its_llvm_text(tmp_path):
    job = Job(Chunk(_LOWERED, ("k",), (), whole=True, kernels=("k",)), Pipeline("none", ()), tmp_path / "k.o")
    text = build(job)
    assert (tmp_path / "k.o").stat().st_size > 0
    with ir.Context():
        assert text == str(ir.Module.parse(text))  # the printed module, as str() prints it
    assert "llvm.func @k" in text


def test_ops_left_unlowered_are_named_when_llvm_cannot_take_them(tmp_path):
    job = Job(Chunk(_NOT_LOWERED, ("k",), (), whole=True, kernels=("k",)), Pipeline("none", ()), tmp_path / "k.o")
    with pytest.raises(LoweringError, match="none did not lower everything to the LLVM dialect; left: arith.addi"):
        build(job)
