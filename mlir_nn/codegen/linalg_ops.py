"""The linalg ops the code generator builds, without MLIR's Python op DSL.

``mlir.dialects.linalg`` defines every named op with its op DSL (``opdsl``) when it is
imported: 40-70 ms of each process that compiles a step (the native first tier's first call,
the compile process, the compile workers). The code generator builds only ``linalg.generic``
(``generic``, a region decorator as ``mlir.dialects.linalg.generic``), ``fill``, ``copy`` and
``matmul``: each is the op class that MLIR's op definitions generate, with the body that the
op's C++ builder gives it (``fill_builtin_region``), as the op DSL builds them. MLIR's bindings
import a dialect's Python module when Python first meets one of its ops or attributes: importing
this module points them at ``mlir_nn.codegen.dialects`` first (``light_dialect_modules``),
whose linalg module holds the op classes and enums only.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir
from mlir._mlir_libs import _mlir
from mlir._mlir_libs._mlirDialectsLinalg import fill_builtin_region
from mlir.dialects._linalg_enum_gen import IteratorType
from mlir.dialects._linalg_ops_gen import CopyOp, FillOp, GenericOp, IndexOp, MatmulOp, YieldOp
from mlir.dialects._ods_common import get_op_result_or_value
from mlir.extras.meta import region_op

__all__ = ["GenericOp", "IndexOp", "IteratorType", "YieldOp", "copy", "fill", "generic", "matmul"]
LIGHT_DIALECTS = "mlir_nn.codegen.dialects"


def light_dialect_modules() -> None:
    """Make MLIR's bindings look for a dialect's Python module in ``LIGHT_DIALECTS`` before
    ``mlir.dialects`` (once per process; dialects without a module there load MLIR's)."""
    search = _mlir.globals.dialect_search_modules
    if LIGHT_DIALECTS not in search:
        _mlir.globals.dialect_search_modules = [LIGHT_DIALECTS, *search]


light_dialect_modules()


def iterator_types(kinds: Sequence[IteratorType | str]) -> ir.ArrayAttr:
    """The ``iterator_types`` attribute of a generic op with loops of ``kinds``."""
    return ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{kind}>") for kind in kinds])


class _Generic(GenericOp):
    """A ``linalg.generic`` with results for tensor outputs and an empty body block whose
    arguments are the operands' element types (``mlir.dialects.linalg.GenericOp_``)."""

    def __init__(self, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value], indexing_maps: Sequence[ir.AffineMap],
                 iterators: Sequence[IteratorType | str], *, loc: ir.Location | None = None,
                 ip: ir.InsertionPoint | None = None) -> None:
        result_types = [o.type for o in outputs] if isinstance(outputs[0].type, ir.RankedTensorType) else []
        super().__init__(result_types, inputs, outputs, indexing_maps, iterator_types(iterators), loc=loc, ip=ip)
        self.regions[0].blocks.append(*[v.type.element_type for v in [*inputs, *outputs]])


generic = region_op(_Generic, terminator=YieldOp)


def _structured(op_class: type, inputs: Sequence[object], outs: Sequence[object], **attributes: object) -> object:
    """A named structured op of ``op_class`` on ``inputs`` into ``outs[0]``, its body filled:
    its result for a tensor output, the op for a buffer."""
    init = get_op_result_or_value(outs[0])
    result_types = [init.type] if isinstance(init.type, ir.RankedTensorType) else []
    op = op_class(result_types, [get_op_result_or_value(v) for v in inputs], [init], **attributes)
    fill_builtin_region(op.operation)
    return op.result if result_types else op


def fill(value: object, *, outs: Sequence[object]) -> object:
    """``linalg.fill`` of ``outs[0]`` with the scalar ``value``."""
    return _structured(FillOp, [value], outs)


def copy(source: object, *, outs: Sequence[object]) -> object:
    """``linalg.copy`` of ``source`` into ``outs[0]`` (with the cast attribute that the op DSL sets)."""
    return _structured(CopyOp, [source], outs, cast=ir.Attribute.parse("#linalg.type_fn<cast_signed>"))


def matmul(a: object, b: object, *, outs: Sequence[object], indexing_maps: Sequence[ir.AffineMap] | None = None
           ) -> object:
    """``linalg.matmul`` of ``a`` and ``b`` accumulated into ``outs[0]`` (``indexing_maps``: transposed
    operands)."""
    return _structured(MatmulOp, [a, b], outs, indexing_maps=indexing_maps)
