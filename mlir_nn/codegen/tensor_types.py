"""MLIR types for IR shapes and dtypes: the batch symbol becomes a dynamic (``?``) dim."""

from __future__ import annotations

from mlir import ir

from mlir_nn.ir.shapes import BATCH, Shape


def element_type(dtype: str) -> ir.Type:
    """f32 or f64 for the IR's two dtypes."""
    if dtype == "float32":
        return ir.F32Type.get()
    if dtype == "float64":
        return ir.F64Type.get()
    raise TypeError(f"codegen: unsupported dtype {dtype}; expected float32 or float64")


def static_dims(shape: Shape) -> list[int]:
    """Shape with the batch symbol as MLIR's dynamic size."""
    dynamic = ir.ShapedType.get_dynamic_size()
    return [dynamic if d == BATCH else int(d) for d in shape]


def tensor_type(shape: Shape, dtype: str) -> ir.RankedTensorType:
    """``tensor<?x32xf32>`` for shape (N, 32) float32."""
    return ir.RankedTensorType.get(static_dims(shape), element_type(dtype))
