"""FunctionBuilder: the linalg building blocks that op lowerings are written with.

Operands are either tensor ``ir.Value``s or Python floats (``const`` nodes): constants
stay scalars and are folded into the bodies of the ops that use them. An element-wise op read
only by one element-wise op of its shape may be ``Deferred`` (``codegen.emit`` says which):
not built, but computed inside the body of the op that reads it. For host code, an element-wise
op with a 0-d result is a ``Scalar``: plain arithmetic in the function's body, which the
bodies of the ops that read it use as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.accumulate import needs_wide_accumulator, wide_reduce
from mlir_nn.codegen.maps import broadcast_map, identity_map, matmul_maps
from mlir_nn.codegen.tensor_types import element_type
from mlir_nn.ir import Node
from mlir_nn.ir.shapes import BATCH, Shape

ScalarFn = Callable[..., ir.Value]


@dataclass(frozen=True, eq=False)
class Deferred:
    """An element-wise op not built: ``fn`` of ``operands`` (of ``shapes``, broadcast to ``shape``),
    computed inside the body of the element-wise op that reads it. Emitting each op of a chain
    as its own generic and fusing them afterwards (``linalg-fuse-elementwise-ops``) cost both
    stages time: a 16x64 Adam MLP's step emitted 803 element-wise generics."""

    shape: tuple[int | str, ...]
    operands: tuple[Deferred | ir.Value | float, ...]
    shapes: tuple[Shape, ...]
    fn: ScalarFn
    result: bool = False  # a result of the step too: also written by the op that computes it


@dataclass(frozen=True, eq=False)
class Scalar:
    """The element of a 0-d result, computed in the function's body (not a generic): an
    optimizer's bias corrections and step counts, one set per parameter, were 4 of Adam's 7
    generics per parameter, each a buffer, an op and its loops through every pass."""

    value: ir.Value


Operand = ir.Value | float | Deferred | Scalar

PARALLEL = linalg.IteratorType.parallel
REDUCTION = linalg.IteratorType.reduction


class FunctionBuilder:
    """Builds ops at the current insertion point of one function body."""

    def __init__(
        self, dtype: str, batch: ir.Value | None, wide_sums: bool = False, strided_copies: bool = False,
        batch_tasks: bool = False, scalars: bool = False,
    ) -> None:
        self.dtype = dtype
        self.element = element_type(dtype)
        self.wide_sums = wide_sums and needs_wide_accumulator(dtype)  # see codegen.accumulate
        self.strided_copies = strided_copies  # pads as strided insert_slice (see codegen.windows.place)
        self.batch_tasks = batch_tasks  # batched products' loops as tasks (see codegen.batched_products)
        self.scalars = scalars  # 0-d element-wise results as Scalars (host code only: a GPU step computes in kernels)
        self.batch = batch  # index Value holding the run-time batch size, if the graph has one
        self.source_of_transpose: dict[object, ir.Value] = {}  # transpose node -> its input tensor
        self.pieces: dict[object, tuple] = {}  # a sum of placed slices -> its pieces (codegen.joined_slices)
        self.pixel_rows: dict[ir.Value, ir.Value] = {}  # an image -> its pixel rows (codegen.windows)
        self.readers: dict[Node, list[Node]] = {}  # node -> the nodes that read it (set by codegen.emit)
        self.results: set[Node] = set()  # the step's outputs and updates
        self.defer_next = False  # the next ``elementwise`` returns a Deferred (set by codegen.emit)
        self._built: dict[Deferred | Scalar, ir.Value] = {}

    # ------------------------------------------------------------------ scalars and sizes

    def scalar(self, value: float) -> ir.Value:
        return arith.constant(self.element, float(value))

    def index(self, value: int) -> ir.Value:
        return arith.constant(ir.IndexType.get(), value)

    def sizes(self, shape: Shape) -> list[int | ir.Value]:
        """Sizes for tensor.empty: ints, and the batch Value for the batch symbol."""
        if BATCH in shape and self.batch is None:
            raise ValueError(f"codegen: shape {shape} has the batch dimension but the graph has no batch input")
        return [self.batch if d == BATCH else int(d) for d in shape]

    def count(self, dims: Sequence[int | str]) -> ir.Value:
        """Product of ``dims`` as a floating-point scalar, taken at run time for the batch dim."""
        static = 1
        batched = 0
        for d in dims:
            if d == BATCH:
                batched += 1
            else:
                static *= int(d)
        if batched == 0:
            return self.scalar(float(static))
        n = self.index(static)
        for _ in range(batched):
            n = arith.muli(n, self.batch)
        i64 = ir.IntegerType.get_signless(64)
        return arith.sitofp(self.element, arith.index_cast(i64, n))

    # ------------------------------------------------------------------ tensors

    def empty(self, shape: Shape) -> ir.Value:
        return tensor.empty(self.sizes(shape), self.element)

    def filled(self, shape: Shape, value: float) -> ir.Value:
        return linalg.fill(self.scalar(value), outs=[self.empty(shape)])

    def tensor_of(self, operand: Operand, shape: Shape) -> ir.Value:
        """A tensor for ops that need one: constants are filled to ``shape``."""
        return self.filled(shape, operand) if isinstance(operand, float) else operand

    # ------------------------------------------------------------------ linalg ops

    def elementwise(self, out_shape: Shape, operands: Sequence[Operand], shapes: Sequence[Shape],
                    fn: ScalarFn, init: ir.Value | None = None) -> ir.Value | Deferred:
        """One linalg.generic computing ``fn(*scalars)`` with numpy broadcasting (a Deferred when
        ``defer_next`` is set: see the module docstring).

        ``fn`` receives one scalar per operand (constants as arith.constant, Deferred operands of
        ``out_shape`` computed in the body from their own operands). ``init`` is the tensor written
        into (a fresh tensor.empty when None).
        """
        if self.scalars and not out_shape and init is None:
            self.defer_next = False
            return Scalar(fn(*(self._element(v) for v in operands)))
        if self.defer_next and init is None:
            self.defer_next = False
            return Deferred(tuple(out_shape), tuple(operands), tuple(shapes), fn)
        rank = len(out_shape)
        whole = tuple(out_shape)
        # a Deferred operand broadcast to a larger shape is built: its body would run per element of the output
        operands = [self.built(v) if isinstance(v, Deferred) and tuple(s) != whole else v
                    for v, s in zip(operands, shapes)]
        leaves: dict[tuple[ir.Value, tuple], ir.AffineMap] = {}  # (tensor, its shape) -> its map, first use first
        extra: list[Deferred] = []  # results computed in the body: outputs after the op's own

        def gather(values: Sequence[Operand], value_shapes: Sequence[Shape]) -> None:
            for value, shape in zip(values, value_shapes):
                if isinstance(value, Deferred):
                    if value.result and value not in extra:
                        extra.append(value)
                    gather(value.operands, value.shapes)
                elif not isinstance(value, float | Scalar):
                    leaves.setdefault((value, tuple(shape)), broadcast_map(shape, out_shape))

        gather(operands, shapes)
        outs = [self.empty(out_shape) if init is None else init, *(self.empty(r.shape) for r in extra)]

        @linalg.generic([v for v, _ in leaves], outs, [*leaves.values(), *[identity_map(rank)] * len(outs)],
                        [PARALLEL] * rank)
        def result(*args: ir.Value) -> ir.Value | list[ir.Value]:
            argument = dict(zip(leaves, args))
            computed: dict[Deferred, ir.Value] = {}

            def scalar(value: Operand, shape: Shape) -> ir.Value:
                if isinstance(value, float):
                    return self.scalar(value)
                if isinstance(value, Scalar):
                    return value.value
                if isinstance(value, Deferred):
                    if value not in computed:
                        computed[value] = value.fn(*(scalar(v, s) for v, s in zip(value.operands, value.shapes)))
                    return computed[value]
                return argument[(value, tuple(shape))]

            value = fn(*(scalar(v, s) for v, s in zip(operands, shapes)))
            return [value, *(computed[r] for r in extra)] if extra else value

        if not extra:
            return result
        self._built.update(zip(extra, result[1:]))
        return result[0]

    def built(self, value: Operand) -> ir.Value | float:
        """``value`` as a tensor (or a constant): a Deferred is built, a Scalar put in a 0-d tensor, once."""
        if not isinstance(value, Deferred | Scalar):
            return value
        if value not in self._built:
            self._built[value] = (tensor.from_elements(ir.RankedTensorType.get([], self.element), [value.value])
                                  if isinstance(value, Scalar) else
                                  self.elementwise(value.shape, value.operands, value.shapes, value.fn))
        return self._built[value]

    def _element(self, value: Operand) -> ir.Value:
        """The element of a 0-d operand, in the function's body."""
        if isinstance(value, float):
            return self.scalar(value)
        if isinstance(value, Scalar):
            return value.value
        return tensor.extract(value, [])

    def scaled_update(self, out_shape: Shape, product: ir.Value, operands: Sequence[Operand],
                      shapes: Sequence[Shape], subtract: bool) -> ir.Value:
        """beta * c +- alpha * product in the product's buffer (``operands``: c, alpha, beta, each
        a tensor or a folded constant), the epilogue of the ops that fold an update into a product."""
        combine = arith.subf if subtract else arith.addf

        def epilogue(acc: ir.Value, c: ir.Value, alpha: ir.Value, beta: ir.Value) -> ir.Value:
            return combine(arith.mulf(beta, c), arith.mulf(alpha, acc))

        return self.elementwise(out_shape, [product, *operands], [out_shape, *shapes], epilogue, init=product)

    def reduce(self, out_shape: Shape, operands: Sequence[ir.Value], in_maps: Sequence[ir.AffineMap],
               out_map: ir.AffineMap, iterators: Sequence[linalg.IteratorType], fn: ScalarFn,
               init: float = 0.0, combine: Callable[[ir.Value, ir.Value], ir.Value] = arith.addf) -> ir.Value:
        """Combine ``fn(*scalars)`` into a tensor of ``out_shape`` filled with ``init`` (a sum by
        default; sums accumulate in float64 when ``wide_sums``)."""
        if self.wide_sums and combine is arith.addf and init == 0.0:
            return wide_reduce(self.element, self.sizes(out_shape), operands, in_maps, out_map, iterators, fn)
        acc = self.filled(out_shape, init)

        @linalg.generic(list(operands), [acc], list(in_maps) + [out_map], list(iterators))
        def result(*args: ir.Value) -> ir.Value:
            *ins, total = args
            return combine(total, fn(*ins))

        return result

    def matmul(self, a: ir.Value, b: ir.Value, out_shape: Shape, transpose_a: bool, transpose_b: bool) -> ir.Value:
        """op(a) @ op(b) into a zero-filled accumulator (transposes via indexing maps)."""
        acc = self.filled(out_shape, 0.0)
        if not transpose_a and not transpose_b:
            return linalg.matmul(a, b, outs=[acc])
        return linalg.matmul(a, b, outs=[acc], indexing_maps=matmul_maps(transpose_a, transpose_b))
