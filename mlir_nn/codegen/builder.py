"""FunctionBuilder: the linalg building blocks that op lowerings are written with.

Operands are either tensor ``ir.Value``s or Python floats (``const`` nodes): constants
stay scalars and are folded into the bodies of the ops that use them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.accumulate import needs_wide_accumulator, wide_reduce
from mlir_nn.codegen.maps import broadcast_map, identity_map, matmul_maps
from mlir_nn.codegen.tensor_types import element_type
from mlir_nn.ir import Node
from mlir_nn.ir.shapes import BATCH, Shape

Operand = ir.Value | float
ScalarFn = Callable[..., ir.Value]

PARALLEL = linalg.IteratorType.parallel
REDUCTION = linalg.IteratorType.reduction


class FunctionBuilder:
    """Builds ops at the current insertion point of one function body."""

    def __init__(
        self, dtype: str, batch: ir.Value | None, wide_sums: bool = False, strided_copies: bool = False,
        batch_tasks: bool = False,
    ) -> None:
        self.dtype = dtype
        self.element = element_type(dtype)
        self.wide_sums = wide_sums and needs_wide_accumulator(dtype)  # see codegen.accumulate
        self.strided_copies = strided_copies  # pads as strided insert_slice (see codegen.windows.place)
        self.batch_tasks = batch_tasks  # batched products' loops as tasks (see codegen.batched_products)
        self.batch = batch  # index Value holding the run-time batch size, if the graph has one
        self.source_of_transpose: dict[object, ir.Value] = {}  # transpose node -> its input tensor
        self.pieces: dict[object, tuple] = {}  # a sum of placed slices -> its pieces (codegen.joined_slices)
        self.pixel_rows: dict[ir.Value, ir.Value] = {}  # an image -> its pixel rows (codegen.windows)
        self.readers: dict[Node, list[Node]] = {}  # node -> the nodes that read it (set by codegen.emit)
        self.results: set[Node] = set()  # the step's outputs and updates

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
                    fn: ScalarFn, init: ir.Value | None = None) -> ir.Value:
        """One linalg.generic computing ``fn(*scalars)`` with numpy broadcasting.

        ``fn`` receives one scalar per operand (constants as arith.constant). ``init``
        is the tensor written into (a fresh tensor.empty when None).
        """
        rank = len(out_shape)
        tensors = [(i, v) for i, v in enumerate(operands) if not isinstance(v, float)]
        maps = [broadcast_map(shapes[i], out_shape) for i, _ in tensors] + [identity_map(rank)]
        out = self.empty(out_shape) if init is None else init

        @linalg.generic([v for _, v in tensors], [out], maps, [PARALLEL] * rank)
        def result(*args: ir.Value) -> ir.Value:
            scalars: list[ir.Value | None] = [None] * len(operands)
            for (i, _), arg in zip(tensors, args):
                scalars[i] = arg
            for i, v in enumerate(operands):
                if isinstance(v, float):
                    scalars[i] = self.scalar(v)
            return fn(*scalars)

        return result

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
