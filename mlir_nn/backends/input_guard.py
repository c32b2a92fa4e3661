"""The compiled step checks its own inputs: NaN or infinity stops it before it writes anything.

Runs on the bufferized step after the memory plan. At the top of the function one loop
per floating-point input ORs ``isnan(x - x)`` over its elements (true for NaN and
infinity); an input holding class labels (an operand of ``one_hot``) ORs "not an integer
in [0, classes)" instead. The whole rest of the body moves into ``scf.if (status == 0)``.
The status, 0 or 1 + the index of the first bad input, is stored into the first word of
the workspace on every call, where the caller reads it back (``backends.base.input_error``
says what was wrong). With threads, a large input is checked in tasks of its element ranges,
their answers a byte each in the workspace's header.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mlir import ir
from mlir.dialects import arith, memref, scf
from mlir.dialects import math as mlir_math

from mlir_nn.backends.memory_plan import entry_function
from mlir_nn.backends.workspace import CHOICE_OFFSET

STATUS_OK = 0
# With threads, an input is checked in tasks of at least CHECK_TASK_ELEMENTS elements, CHECK_TASKS_MAX
# at most: on one thread, the check of the 1000-10 step's 10000 x 1000 input took about 1 ms of its
# 4.3 ms at batch 10000 (13% of its samples on one thread)
CHECK_TASK_ELEMENTS, CHECK_TASKS_MAX = 1 << 16, 8
CHECK_SLOTS_AT = 8  # the tasks' answers: a byte each in the workspace's header, from this offset
assert CHECK_SLOTS_AT + CHECK_TASKS_MAX <= CHOICE_OFFSET  # before the team choice in the header


def _flat(value: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A 1-D view of a contiguous memref and its element count."""
    kind = ir.MemRefType(value.type)
    index = ir.IndexType.get()
    if kind.rank == 1:
        flat = value
    else:
        count = ir.ShapedType.get_dynamic_size() if not kind.has_static_shape else math.prod(kind.shape)
        flat_type = ir.MemRefType.get([count], kind.element_type)
        flat = memref.collapse_shape(flat_type, value, ir.ArrayAttr.get([
            ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d) for d in range(kind.rank)])]))
    return flat, memref.dim(flat, arith.constant(index, 0))


def _not_finite(x: ir.Value) -> ir.Value:
    d = arith.subf(x, x)
    return arith.cmpf(arith.CmpFPredicate.UNO, d, d)


def _not_a_label(classes: int) -> Callable[[ir.Value], ir.Value]:
    """x is not an integer in [0, classes) (NaN compares unordered, so it is caught too)."""

    def bad(x: ir.Value) -> ir.Value:
        below = arith.cmpf(arith.CmpFPredicate.ULT, x, arith.constant(x.type, 0.0))
        above = arith.cmpf(arith.CmpFPredicate.UGE, x, arith.constant(x.type, float(classes)))
        fraction = arith.cmpf(arith.CmpFPredicate.UNE, x, mlir_math.floor(x))
        return arith.ori(arith.ori(below, above), fraction)

    return bad


def _any_in(flat: ir.Value, start: ir.Value, end: ir.Value, bad: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """An i1 that is true when ``bad`` holds for some element of ``flat[start:end]``."""
    false = arith.constant(ir.IntegerType.get_signless(1), 0)
    loop = scf.ForOp(start, end, arith.constant(ir.IndexType.get(), 1), [false])
    with ir.InsertionPoint(loop.body):
        x = memref.load(flat, [loop.induction_variable])
        scf.YieldOp([arith.ori(loop.inner_iter_args[0], bad(x))])
    return loop.results[0]


def _any_in_tasks(flat: ir.Value, count: ir.Value, bad: Callable[[ir.Value], ir.Value], slots: ir.Value) -> ir.Value:
    """``_any_in`` over the whole of ``flat`` as tasks (an ``scf.forall`` the pipeline spreads over
    threads) of CHECK_TASK_ELEMENTS elements or more, CHECK_TASKS_MAX at most, each storing its
    answer into its byte of ``slots``; then the slots ORed. A count of one task's elements or fewer
    is one task, run in place."""
    index, i8 = ir.IndexType.get(), ir.IntegerType.get_signless(8)
    tasks = arith.maxui(arith.minui(arith.divui(count, arith.constant(index, CHECK_TASK_ELEMENTS)),
                                    arith.constant(index, CHECK_TASKS_MAX)), arith.constant(index, 1))
    per_task = arith.ceildivui(count, tasks)
    forall = scf.ForallOp([0], [tasks], [1])
    with ir.InsertionPoint(forall.body):
        task = forall.body.arguments[0]
        start = arith.minui(arith.muli(task, per_task), count)
        end = arith.minui(arith.addi(start, per_task), count)
        memref.store(arith.extui(i8, _any_in(flat, start, end, bad)), slots, [task])
        scf.InParallelOp()
    zero = arith.constant(i8, 0)
    loop = scf.ForOp(arith.constant(index, 0), tasks, arith.constant(index, 1), [zero])
    with ir.InsertionPoint(loop.body):
        scf.YieldOp([arith.ori(loop.inner_iter_args[0], memref.load(slots, [loop.induction_variable]))])
    return arith.cmpi(arith.CmpIPredicate.ne, loop.results[0], zero)


def _any(value: ir.Value, bad: Callable[[ir.Value], ir.Value], slots: ir.Value | None) -> ir.Value:
    """An i1 that is true when ``bad`` holds for some element of the float memref ``value``;
    with ``slots``, checked in tasks on threads (``_any_in_tasks``)."""
    kind = ir.MemRefType(value.type)
    if kind.rank == 0:
        return bad(memref.load(value, []))
    flat, count = _flat(value)
    if slots is not None and (not kind.has_static_shape or math.prod(kind.shape) >= 2 * CHECK_TASK_ELEMENTS):
        return _any_in_tasks(flat, count, bad, slots)
    return _any_in(flat, arith.constant(ir.IndexType.get(), 0), count, bad)


def guard_inputs(module: ir.Module, inputs: list[int], workspace: ir.Value,
                 labels: dict[int, int] | None = None, tasks: bool = False) -> None:
    """Check the arguments ``inputs`` (float memrefs) at entry; run the body only if all are
    finite, and those at positions ``labels`` maps hold integers in [0, classes); store the
    status (0, or 1 + position in ``inputs`` of the first bad one). ``tasks``: large inputs are
    checked in tasks that the pipeline spreads over threads (it must lower ``scf.forall``)."""
    labels = labels or {}
    fn = entry_function(module)
    block = fn.regions[0].blocks[0]
    body = list(block.operations)[:-1]  # everything but the return moves into the scf.if
    i32 = ir.IntegerType.get_signless(32)
    with module.context, fn.location, ir.InsertionPoint.at_block_begin(block):
        status = arith.constant(i32, STATUS_OK)
        index = ir.IndexType.get()
        slots = memref.view(ir.MemRefType.get([CHECK_TASKS_MAX], ir.IntegerType.get_signless(8)), workspace,
                            arith.constant(index, CHECK_SLOTS_AT), []) if tasks else None
        for position in reversed(range(len(inputs))):  # the first bad input wins
            arg = block.arguments[inputs[position]]
            if isinstance(ir.MemRefType(arg.type).element_type, ir.FloatType):
                bad = _not_a_label(labels[position]) if position in labels else _not_finite
                status = arith.select(_any(arg, bad, slots), arith.constant(i32, position + 1), status)
        word = memref.view(ir.MemRefType.get([1], i32), workspace, arith.constant(index, 0), [])
        memref.store(status, word, [arith.constant(index, 0)])
        ok = arith.cmpi(arith.CmpIPredicate.eq, status, arith.constant(i32, STATUS_OK))
        guarded = scf.IfOp(ok)
        with ir.InsertionPoint(guarded.then_block):
            end = scf.YieldOp([])
    for op in body:
        op.operation.move_before(end)
