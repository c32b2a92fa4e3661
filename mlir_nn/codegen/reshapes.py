"""Reshapes as views: a reshape that only merges or only splits neighbouring axes becomes
``tensor.collapse_shape`` / ``tensor.expand_shape`` (no shape buffer, no copy on any target)."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import tensor

from mlir_nn.codegen.builder import FunctionBuilder
from mlir_nn.codegen.tensor_types import tensor_type
from mlir_nn.ir.shapes import BATCH, Shape


def reassociation(long: Shape, short: Shape) -> list[list[int]] | None:
    """For each axis of ``short``, the neighbouring axes of ``long`` that merge into it (size-1
    axes at the end join the last group); None when the reshape is not such a merge. The batch
    axis only merges with size-1 axes; a scalar is the empty merge of size-1 axes."""
    if not short:
        return [] if all(d == 1 for d in long) else None
    groups: list[list[int]] = []
    i = 0
    for d in short:
        group: list[int] = []
        if d == BATCH:
            while i < len(long) and long[i] == 1:
                group.append(i)
                i += 1
            if i == len(long) or long[i] != BATCH:
                return None
            group.append(i)
            i += 1
        else:
            size = 1
            while i < len(long) and long[i] != BATCH and (not group or size < int(d)):
                size *= int(long[i])
                group.append(i)
                i += 1
            if not group or size != int(d):
                return None
        groups.append(group)
    while groups and i < len(long) and long[i] == 1:
        groups[-1].append(i)
        i += 1
    return groups if i == len(long) else None


def view_reshape(b: FunctionBuilder, x: ir.Value, src: Shape, dst: Shape) -> ir.Value | None:
    """``x`` reshaped from ``src`` to ``dst`` as a collapse or an expand (``x`` itself when the shapes
    are equal), or None if it is neither."""
    if tuple(src) == tuple(dst):
        return x
    kind = tensor_type(dst, b.dtype)
    if len(dst) < len(src):
        groups = reassociation(src, dst)
        return None if groups is None else tensor.collapse_shape(kind, x, groups)
    if len(dst) > len(src):
        groups = reassociation(dst, src)
        if groups is None:
            return None
        sizes = b.sizes(dst)
        dynamic = ir.ShapedType.get_dynamic_size()
        return tensor.expand_shape(kind, x, groups, [s for s in sizes if isinstance(s, ir.Value)],
                                   [dynamic if isinstance(s, ir.Value) else int(s) for s in sizes])
    return None
