"""Plain SGD updates of a product, W + c * P, recognized so that the product accumulates into W.

An SGD step updates a weight with its gradient, a product over the batch: W - lr * (X^T dY), an
element-wise op that reads the product. A blocked product writes its accumulator (a pass over a
buffer of W's size), then the update reads it and W and writes W: for a wide layer at a small
batch (1024 x 4096 at batch 16) those passes cost about as much as the product. Recognized here,
the update becomes the product itself (``cpu_matmul``): its register blocks start from W and one
operand is scaled by c as it is packed (``copy_times_factor``, the packing copies), W + (c X)^T dY,
one read and one write of W.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import dims_map
from mlir_nn.codegen.shaped import dim_sizes, indexing_maps

_PARALLEL = "#linalg.iterator_type<parallel>"


@dataclass(frozen=True)
class Update:
    """``epilogue`` computes ``parameter`` + ``factor`` * product (``factor`` a 0-d tensor or a
    constant; negated when ``negate``); its result replaces the epilogue's."""

    epilogue: ir.Operation
    parameter: ir.Value
    factor: ir.Value | float
    negate: bool


def parameter_update(product: ir.Value) -> Update | None:
    """The update whose only reader of ``product`` is an element-wise op yielding P + c * product
    or P - c * product (P read with the product's map: a parameter of its shape; c a 0-d operand
    or a constant; P may be multiplied by the constant 1), else None."""
    uses = list(product.uses)
    op = uses[0].owner if uses else None
    if (op is None or any(use.owner != op for use in uses) or op.name != "linalg.generic" or len(op.results) != 1
            or any(str(kind) != _PARALLEL for kind in op.attributes["iterator_types"])):
        return None
    maps, inputs = indexing_maps(op), list(op.operands[:len(op.operands) - 1])
    body = op.regions[0].blocks[0]
    if list(body.arguments[len(inputs)].uses):
        return None
    arguments = list(body.arguments)
    product_args = [arguments[i] for i, x in enumerate(inputs) if x == product and maps[i] == maps[-1]]
    params = [(arguments[i], x) for i, x in enumerate(inputs)
              if x != product and x.type == product.type and maps[i] == maps[-1]]
    scalars = [(arguments[i], x) for i, x in enumerate(inputs) if ir.RankedTensorType(x.type).rank == 0]
    result = body.operations[len(body.operations) - 1].operands[0]
    top = result.owner
    if isinstance(top, ir.Block) or top.name not in ("arith.addf", "arith.subf") or not product_args:
        return None
    for param_side, product_side in ((0, 1), (1, 0)) if top.name == "arith.addf" else ((0, 1),):
        parameter = _parameter_term(top.operands[param_side], params)
        factor = _scaled_product(top.operands[product_side], product_args[0], scalars)
        if parameter is not None and factor is not None:
            return Update(op, parameter, factor, top.name == "arith.subf")
    return None


def _constant(value: ir.Value) -> float | None:
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.constant":
        return None
    attribute = owner.attributes["value"]
    return attribute.value if isinstance(attribute, ir.FloatAttr) else None


def _parameter_term(value: ir.Value, params: list[tuple[ir.Value, ir.Value]]) -> ir.Value | None:
    """The parameter that ``value`` is (a block argument, or it times the constant 1), or None."""
    for argument, parameter in params:
        if value == argument:
            return parameter
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.mulf":
        return None
    x, y = owner.operands
    for one, other in ((x, y), (y, x)):
        if _constant(one) == 1.0:
            return _parameter_term(other, params)
    return None


def _scaled_product(value: ir.Value, product: ir.Value, scalars: list[tuple[ir.Value, ir.Value]]
                    ) -> ir.Value | float | None:
    """c when ``value`` is c * the product's block argument (c a 0-d operand or a constant; 1.0
    for the product alone), else None."""
    if value == product:
        return 1.0
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.mulf":
        return None
    x, y = owner.operands
    for factor, other in ((x, y), (y, x)):
        if other != product:
            continue
        constant = _constant(factor)
        if constant is not None:
            return constant
        found = [operand for argument, operand in scalars if factor == argument]
        if found:
            return found[0]
    return None


def copy_times_factor(x: ir.Value, into: ir.Value, x_map: ir.AffineMap, update: Update | None) -> ir.Value:
    """``into`` = ``x`` read through ``x_map`` (a permutation), times the update's factor (negated
    where it subtracts; a plain copy without ``update``): one parallel ``linalg.generic``, which
    reads a 0-d factor as an operand of its own."""
    rank = ir.RankedTensorType(into.type).rank
    scalars = [] if update is None or isinstance(update.factor, float) else [update.factor]
    maps = [x_map] + [dims_map(rank, [])] * len(scalars) + [dims_map(rank, list(range(rank)))]

    @linalg.generic([x, *scalars], [into], maps, [linalg.IteratorType.parallel] * rank)
    def copy(value: ir.Value, *scalar_and_out: ir.Value) -> ir.Value:
        if update is None:
            return value
        if not scalars:
            return arith.mulf(value, arith.constant(value.type, -update.factor if update.negate else update.factor))
        product = arith.mulf(value, scalar_and_out[0])
        return arith.negf(product) if update.negate else product

    return copy


def scaled(x: ir.Value, update: Update) -> ir.Value:
    """``x`` times the update's factor (negated where it subtracts), a fresh tensor."""
    rank = ir.RankedTensorType(x.type).rank
    out = tensor.empty(dim_sizes(x), ir.RankedTensorType(x.type).element_type)
    return copy_times_factor(x, out, dims_map(rank, list(range(rank))), update)
