"""The body of each parallel loop of a kernel as a function of its own, which the loop calls.

OpenMP's IR builder outlines a parallel loop (``convert-scf-to-openmp``) into a function that
gets the loop's values through one struct of pointers: LLVM cannot tell that the buffers it
reads and writes do not overlap, keeps every store of the body in memory where a register
would do and guards vector loops with overlap checks. Here, right before that pass, the body
of each outermost ``scf.parallel`` of a kernel moves into a ``func.func`` (``BODY_PREFIX``)
that takes the values it reads as arguments (constants are copied in), so that
``task_aliasing`` can mark its buffers ``noalias`` as ``kernel_split`` marks the kernel's.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, func, scf

from mlir_nn.codegen.walk import symbol

BODY_PREFIX = "parallel_body"
_CONSTANTS = frozenset({"arith.constant", "ub.poison"})


def _outermost_loops(kernel: ir.Operation) -> list[ir.Operation]:
    loops: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "scf.parallel":
            loops.append(op)
            return ir.WalkResult.SKIP
        return ir.WalkResult.ADVANCE

    kernel.walk(visit, ir.WalkOrder.PRE_ORDER)
    return loops


def _outside_reads(ops: list[ir.Operation]) -> list[tuple[ir.Operation, int, ir.Value]]:
    """Where ``ops`` (and the ops nested in them) read values defined outside them: (op,
    operand position, value), in walk order."""
    inside: list[ir.Operation] = []
    for op in ops:
        op.walk(lambda inner: inside.append(inner) or ir.WalkResult.ADVANCE, ir.WalkOrder.PRE_ORDER)
    defined = set(inside)
    reads = []
    for op in inside:
        for k, value in enumerate(op.operands):
            owner = value.owner
            if isinstance(owner, ir.Block):
                owner = owner.owner  # a block argument: the op whose region holds the block
            if owner.operation not in defined:
                reads.append((op, k, value))
    return reads


def _outline(loop: ir.Operation, name: str, module: ir.Module) -> bool:
    """Move ``loop``'s body (but its terminator) into the function ``name`` appended to
    ``module`` and call it there instead; False when the body is empty."""
    body = loop.regions[0].blocks[0]
    ops = [op.operation for op in body.operations][:-1]
    if not ops:
        return False
    reads = _outside_reads(ops)
    values = list(dict.fromkeys(value for _, _, value in reads))
    constants = [v for v in values if isinstance(v.owner, ir.OpView | ir.Operation) and v.owner.name in _CONSTANTS]
    arguments = [v for v in values if v not in set(constants)]
    with ir.InsertionPoint(module.body), loop.location:
        function = func.FuncOp(name, ([v.type for v in arguments], []), visibility="private")
        entry = function.add_entry_block()
        with ir.InsertionPoint(entry):
            end = func.ReturnOp([])
    replacement = dict(zip(arguments, entry.arguments))
    for value in constants:
        replacement[value] = value.owner.operation.clone(ir.InsertionPoint(end)).results[0]
    for op in ops:
        op.move_before(end)
    for op, k, value in reads:
        op.operands[k] = replacement[value]
    with ir.InsertionPoint.at_block_terminator(body), loop.location:
        func.CallOp([], ir.FlatSymbolRefAttr.get(name), arguments)
    _alone_when_single(loop, name, arguments)
    return True


def _alone_when_single(loop: ir.Operation, name: str, arguments: list[ir.Value]) -> None:
    """Guard ``loop`` (its body the call of ``name`` with ``arguments``): when it has one
    iteration, the body is called at the lower bounds, with no team forked (the moons step's
    loops at batch 10: a fork each cost 0.5 us of its 2.9)."""
    ivs = list(loop.regions[0].blocks[0].arguments)
    n = len(ivs)
    lower, upper, step = (list(loop.operands)[k * n:(k + 1) * n] for k in range(3))
    with ir.InsertionPoint(loop), loop.location:
        single = None
        for lo, hi, st in zip(lower, upper, step):  # lo < hi <= lo + st
            some = arith.CmpIOp(arith.CmpIPredicate.slt, lo, hi).result
            one = arith.CmpIOp(arith.CmpIPredicate.sle, hi, arith.AddIOp(lo, st).result).result
            both = arith.AndIOp(some, one).result
            single = both if single is None else arith.AndIOp(single, both).result
        guard = scf.IfOp(single, [], has_else=True)
        with ir.InsertionPoint(guard.then_block):
            at = dict(zip(ivs, lower))
            func.CallOp([], ir.FlatSymbolRefAttr.get(name), [at.get(v, v) for v in arguments])
            scf.YieldOp([])
        with ir.InsertionPoint(guard.else_block):
            end = scf.YieldOp([])
    loop.move_before(end)


def schedule_worksharing_loops(module: ir.Module, functions: tuple[str, ...]) -> None:
    """The worksharing loops of ``functions`` (LLVM dialect: the kernels, the step; their
    parallel loops' bodies are functions of their own) end without a barrier (``nowait``):
    each is its parallel region's last op, whose end joins the team. Their schedule is dynamic:
    the task runtime gives each thread the range a static schedule would, and a thread whose
    range is done takes iterations from the others' (``task_runtime.c``)."""
    nowait = ir.UnitAttr.get()
    dynamic = ir.Attribute.parse("#omp<schedulekind dynamic>")

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "omp.wsloop":
            op.attributes["nowait"] = nowait
            op.attributes["schedule_kind"] = dynamic
            return ir.WalkResult.SKIP
        return ir.WalkResult.ADVANCE

    for op in [op.operation for op in module.body.operations]:
        if op.name == "llvm.func" and op.regions[0].blocks and symbol(op) in functions:
            op.walk(visit, ir.WalkOrder.PRE_ORDER)


def outline_parallel_bodies(module: ir.Module) -> int:
    """Outline the body of every outermost ``scf.parallel`` of ``module``'s functions (see the
    module's docstring); returns how many were outlined."""
    functions = [op.operation for op in module.body.operations if op.operation.name == "func.func"]
    count = 0
    for kernel in functions:
        if not kernel.regions[0].blocks:
            continue
        for i, loop in enumerate(_outermost_loops(kernel)):
            count += _outline(loop, f"{BODY_PREFIX}{i}_{symbol(kernel)}", module)
    return count
