"""Accurate sums for the CPU: reductions of float32 (or narrower) values accumulate in float64.

A ``linalg.generic`` reduction adds its elements one after the other into the output. In
float32 the rounding error of that running sum grows with the number of elements: the
loss of a 2M-row batch came out 1.3e-3 off. Accumulating in float64 and rounding once at
the end keeps the result within a few float32 ulps of the exact sum for any batch the
machine can hold (float64 graphs already sum in float64). It costs a widening per element
and one narrowing pass over the (small) output. The float64 adds may be reassociated
(``reassoc``): LLVM then keeps the running sum in vector lanes instead of one chain of
dependent adds (a row sum of 64 elements waited on 64 add latencies; the GPT step's
softmax and LayerNorm row sums ran 3-4x faster). They also ignore the sign of a zero
(``nsz``), without which LLVM's SLP vectorizer leaves a chain of adds that a full unroll
made of a short inner loop scalar: a convolution's bias gradient (a sum over rows of 32
pixels) ran as one scalar add per pixel, 2-3% of the VGG-small step, twice its time with
vector lanes. In float64, the order of at most a few million float32 terms changes the
float32 result by no more than its final rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from mlir import ir
from mlir.dialects import arith, tensor

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.codegen.maps import identity_map

PARALLEL = linalg.IteratorType.parallel
WIDE_BITS = 64


def needs_wide_accumulator(dtype: str) -> bool:
    """True for float dtypes narrower than float64."""
    return np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize * 8 < WIDE_BITS


def reassoc() -> ir.Attribute:
    """Fast-math flags that let LLVM split a float64 running sum into vector lanes (loops and unrolled chains)."""
    return ir.Attribute.parse("#arith.fastmath<reassoc,nsz>")


def wide_reduce(element: ir.Type, sizes: list[int | ir.Value], operands: Sequence[ir.Value],
                in_maps: Sequence[ir.AffineMap], out_map: ir.AffineMap, iterators: Sequence[linalg.IteratorType],
                fn: Callable[..., ir.Value]) -> ir.Value:
    """Sum ``fn(*scalars)`` in float64 into a tensor of ``sizes``, then round it to ``element``."""
    wide = ir.F64Type.get()
    acc = linalg.fill(arith.constant(wide, 0.0), outs=[tensor.empty(sizes, wide)])

    @linalg.generic(list(operands), [acc], list(in_maps) + [out_map], list(iterators))
    def total(*args: ir.Value) -> ir.Value:
        *ins, running = args
        return arith.addf(running, arith.extf(wide, fn(*ins)), fastmath=reassoc())

    rank = len(sizes)

    @linalg.generic([total], [tensor.empty(sizes, element)], [identity_map(rank)] * 2, [PARALLEL] * rank)
    def result(value: ir.Value, _out: ir.Value) -> ir.Value:
        return arith.truncf(element, value)

    return result
