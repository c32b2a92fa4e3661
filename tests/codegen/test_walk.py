"""The walks that find ops: the linalg-only walk finds what the whole walk finds."""

from __future__ import annotations

import pytest

from mlir_nn.codegen import cpu_matmul, emit_linalg
from mlir_nn.codegen.cpu_matmul import rewrite_matmuls
from mlir_nn.codegen.walk import collect_linalg_ops, collect_ops
from tests.codegen.zoo import matmul_zoo


def _linalg(op) -> bool:
    return op.name.startswith("linalg.") and op.name not in ("linalg.yield", "linalg.index")


@pytest.mark.parametrize(("k", "m", "rows"), [(7, 13, "N"), (257, 33, "N"), (33, 1, 257), (300, 300, "N")])
def test_the_linalg_walk_finds_the_linalg_ops_of_the_whole_walk_in_its_order(k, m, rows):
    module = emit_linalg(matmul_zoo(k, m, "float32", rows), wide_sums=True, batch_tasks=True)
    for stage in ("emitted", "rewritten"):
        if stage == "rewritten":
            rewrite_matmuls(module, True)  # blocked products, tasks (scf.forall) and vector bodies
        found = collect_linalg_ops(module, _linalg)
        assert found and found == collect_ops(module, _linalg)
        generics = collect_linalg_ops(module, lambda op: op.name == "linalg.generic")
        assert generics == [op for op in found if op.name == "linalg.generic"]


def _tag_values(module, tag: str) -> set[tuple[int, ...]]:
    from mlir import ir

    tagged = collect_ops(module, lambda op: op.name == "linalg.generic" and tag in op.attributes)
    return {tuple(ir.DenseI64ArrayAttr(op.attributes[tag])) for op in tagged}


@pytest.mark.parametrize(("k", "m", "rows"), [(7, 13, "N"), (257, 33, "N"), (33, 1, 257), (300, 300, "N")])
def test_the_schedule_tags_of_one_walk_are_those_of_every_tagged_product(monkeypatch, k, m, rows):
    found = cpu_matmul._schedule_tags
    seen = []

    def checked(module):
        tags = found(module)
        assert tags.tasks == _tag_values(module, cpu_matmul.PARALLEL_TASKS)
        assert tags.small_tasks == {t[0] for t in _tag_values(module, cpu_matmul.SMALL_TASKS)}
        assert tags.splits == _tag_values(module, cpu_matmul.SPLIT_LANES)
        assert tags.block_splits == _tag_values(module, cpu_matmul.SPLIT_LANES_IN_BLOCKS)
        assert tags.chunk_splits == _tag_values(module, cpu_matmul.SPLIT_LANES_IN_CHUNKS)
        assert tags.chunks == {(tag, t) for tag in (cpu_matmul.SMALL_CHUNK, cpu_matmul.SMALL_CHUNK_TASKS)
                               for t in _tag_values(module, tag)}
        seen.append(tags)
        return tags

    monkeypatch.setattr(cpu_matmul, "_schedule_tags", checked)
    rewrite_matmuls(emit_linalg(matmul_zoo(k, m, "float32", rows), wide_sums=True, batch_tasks=True), True)
    assert len(seen) == 1
