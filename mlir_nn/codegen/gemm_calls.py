"""Matrix products as calls of a precompiled C GEMM, for the quick tier.

The quick tier compiles a step at LLVM -O0 in the calling process: there, the products' blocked
vector code (``cpu_matmul``) was most of the compile (Adam MLP 4x256, batch 128: 0.67 s of which
0.41 s went to the products' schedule, passes and LLVM). Instead, every ``linalg.matmul`` whose
operands and result share the element type float32 or float64 stays a ``linalg.matmul`` through
bufferization (``rewrite_matmuls`` leaves it, ``library_product``) and then becomes a call of
``mlirnn_gemm_f32`` or ``mlirnn_gemm_f64`` (``mlir_nn/backends/gemm.c``: C += op(A) op(B), any
strides, built once per machine), its operands cast to ``memref<?x?xT, strided<[?, ?], offset: ?>>``
(the callee reads sizes and strides from the descriptors) and the transposes passed as flags.
LLVM then compiles only the element-wise code.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, memref

from mlir_nn.codegen.shaped import matmul_transposes
from mlir_nn.codegen.walk import collect_ops

SYMBOLS = {"f32": "mlirnn_gemm_f32", "f64": "mlirnn_gemm_f64"}


def _element(value: ir.Value) -> str:
    return str(ir.ShapedType(value.type).element_type)


def library_product(op: ir.Operation) -> bool:
    """True for a ``linalg.matmul`` (on tensors or memrefs) that the C GEMM computes: A, B and C
    of one element type, float32 or float64."""
    kinds = {_element(v) for v in op.operands[:3]}
    return op.name == "linalg.matmul" and len(kinds) == 1 and kinds <= SYMBOLS.keys()


def _declare(module: ir.Module, symbol: str, operand: ir.Type) -> None:
    i64 = ir.IntegerType.get_signless(64)
    with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown():
        func.FuncOp(symbol, ([i64, i64, operand, operand, operand], []), visibility="private")


def products_as_calls(module: ir.Module) -> int:
    """Replace every ``library_product`` on memrefs in ``module`` with a call of the C GEMM
    (declared once per element type); how many were replaced."""
    products = collect_ops(module, lambda op: op.name == "linalg.matmul" and library_product(op))
    declared: set[str] = set()
    with module.context:
        dynamic = ir.ShapedType.get_dynamic_size()
        i64 = ir.IntegerType.get_signless(64)
        for op in products:
            kind = _element(op.operands[2])
            element = ir.ShapedType(op.operands[2].type).element_type
            layout = ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(), [dynamic, dynamic])
            operand = ir.MemRefType.get([dynamic, dynamic], element, layout, loc=op.location)
            if kind not in declared:
                _declare(module, SYMBOLS[kind], operand)
                declared.add(kind)
            with ir.InsertionPoint(op), op.location:
                flags = [arith.constant(i64, int(t)) for t in matmul_transposes(op)]
                matrices = [memref.cast(operand, v) for v in op.operands[:3]]
                func.CallOp([], ir.FlatSymbolRefAttr.get(SYMBOLS[kind]), flags + matrices)
            op.erase()
    return len(products)
