"""A static memory plan: every intermediate buffer of a step is a view of one workspace.

Runs on the bufferized step (memref level, before buffer deallocation). Each top-level
``memref.alloc`` whose dynamic sizes are all the batch size (or whose one dynamic size is
at most ``slope * batch + intercept``, as the packed products' ceil(batch / tile) panels)
becomes a ``memref.view``
of a workspace argument appended to the function, so the compiled step calls no malloc.
Buffers are grouped by how many batch-sized dims they have (power ``k``); within a
group every buffer gets a fixed offset, reused across buffers whose live ranges do not
overlap (first fit by decreasing size). Because all sizes of a group scale by the same
``batch**k``, one plan serves every batch size:

    workspace bytes = HEADER + linear_fixed + sum_k group_bytes[k] * batch**k

where the batch**1 group takes ``group_bytes[1] * batch + linear_fixed`` bytes: its
buffers sit at offsets ``a * batch + b`` (``first_fit_linear``).

A static-shaped ``memref.alloc`` nested in loops (``scf.for``, ``scf.forall`` with static
bounds: the buffers of a task, such as a chunked convolution gradient's columns) is planned too
when no enclosing ``scf.for`` carries it into its next iteration: it gets one slot per
iteration of its enclosing ``scf.forall`` loops (tasks run at once), live for the top-level op
that holds it (``_task_slots``).

The caller allocates that (from numpy, so a failed allocation is a ``MemoryError``
before native code runs) and passes it as the last argument. The first ``HEADER`` bytes
hold the step's status word (see ``mlir_nn.backends.input_guard``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from fractions import Fraction

from mlir import ir
from mlir.dialects import arith, memref

from mlir_nn.backends.workspace import ALIGN, HEADER, MemoryPlan, round_up

ENTRY_ATTR = "llvm.emit_c_interface"


def entry_function(module: ir.Module) -> ir.Operation:
    """The step's public function (the one with a C interface)."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and ENTRY_ATTR in op.attributes and op.regions[0].blocks:
            return op
    raise ValueError("memory plan: the module has no function with a C interface")


def append_argument(fn: ir.Operation, kind: ir.Type) -> ir.Value:
    """Add a trailing argument of type ``kind`` to ``fn`` (signature and entry block)."""
    block = fn.regions[0].blocks[0]
    value = block.add_argument(kind, fn.location)
    old = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get([*old.inputs, kind], old.results))
    if "arg_attrs" in fn.attributes:
        attrs = list(ir.ArrayAttr(fn.attributes["arg_attrs"]))
        fn.attributes["arg_attrs"] = ir.ArrayAttr.get([*attrs, ir.DictAttr.get({})])
    return value


def _element_bytes(kind: ir.Type) -> int | None:
    if isinstance(kind, ir.IndexType):
        return 8
    for cls in (ir.FloatType, ir.IntegerType):
        if isinstance(kind, cls):
            return (cls(kind).width + 7) // 8
    return None


def _is_batch(value: ir.Value, batch_dims: Collection[tuple[int, int]]) -> bool:
    """True when ``value`` is ``memref.dim`` of an argument at a batch-sized position."""
    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView) or owner.name != "memref.dim":
        return False
    source, index = owner.operands
    if not isinstance(source, ir.BlockArgument) or index.owner.name != "arith.constant":
        return False
    dim = ir.IntegerAttr(index.owner.attributes["value"]).value
    return (ir.BlockArgument(source).arg_number, dim) in batch_dims


def _bound(value: ir.Value, batch_dims: Collection[tuple[int, int]]) -> tuple[Fraction, Fraction, ir.Value] | None:
    """(slope, intercept, batch) with ``value <= slope * batch + intercept`` for every batch
    size, when ``value`` is built from the batch size and constants by +, * constant and
    division by a positive constant (the packed products' ceil(N / tile) * tile); else None."""
    if _is_batch(value, batch_dims):
        return Fraction(1), Fraction(0), value
    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return None
    if owner.name == "memref.dim":
        index = _constant(owner.operands[1])
        return None if index is None else _dim_bound(owner.operands[0], index, batch_dims)
    constant = _constant(value)
    if constant is not None:
        return None  # a size without the batch is static: not a dynamic dim of a planned buffer
    if owner.name not in ("arith.addi", "arith.muli", "arith.divui", "arith.ceildivui"):
        return None
    lhs, rhs = owner.operands
    left, right = _bound(lhs, batch_dims), _constant(rhs)
    if owner.name == "arith.addi":
        if left is None or right is None:
            left, right = _bound(rhs, batch_dims), _constant(lhs)
        return None if left is None or right is None or right < 0 else (left[0], left[1] + right, left[2])
    if owner.name == "arith.muli" and (left is None or right is None):
        left, right = _bound(rhs, batch_dims), _constant(lhs)
    if left is None or right is None or right <= 0:
        return None
    if owner.name == "arith.muli":
        return left[0] * right, left[1] * right, left[2]
    slack = 0 if owner.name == "arith.divui" else right - 1  # ceil(x / c) <= (x + c - 1) / c
    return left[0] / right, (left[1] + slack) / right, left[2]


def _dim_bound(source: ir.Value, dim: int,
               batch_dims: Collection[tuple[int, int]]) -> tuple[Fraction, Fraction, ir.Value] | None:
    """``_bound`` of dynamic size ``dim`` of a buffer, read through the views that carry it: an
    allocation's, a workspace view's or a subview's size operand, or a collapse_shape's group (a
    conv's (N * P * Q, ...) im2col rows: the packed products' panels are sized from them)."""
    owner = source.owner
    if not isinstance(owner, ir.Operation | ir.OpView):
        return None
    shape = ir.MemRefType(source.type).shape
    if not ir.ShapedType.is_dynamic_size(shape[dim]):
        return None
    if owner.name in ("memref.alloc", "memref.view"):
        sizes = list(owner.operands)[(2 if owner.name == "memref.view" else 0):]
        position = sum(1 for d in shape[:dim] if ir.ShapedType.is_dynamic_size(d))
        return _bound(sizes[position], batch_dims) if position < len(sizes) else None
    if owner.name == "memref.subview":  # sizes as written (a rank-reducing one is left alone)
        static = list(ir.DenseI64ArrayAttr(owner.attributes["static_sizes"]))
        if len(static) != len(shape) or not ir.ShapedType.is_dynamic_size(static[dim]):
            return None
        position = sum(1 for d in static[:dim] if ir.ShapedType.is_dynamic_size(d))
        return _bound(list(owner.opview.sizes)[position], batch_dims)
    if owner.name != "memref.collapse_shape":
        return None
    reassociation = ir.ArrayAttr(owner.attributes["reassociation"])
    groups = [[ir.IntegerAttr(i).value for i in ir.ArrayAttr(g)] for g in reassociation]
    inner = ir.MemRefType(owner.operands[0].type).shape
    dynamic = [i for i in groups[dim] if ir.ShapedType.is_dynamic_size(inner[i])]
    if len(dynamic) != 1:
        return None
    bound = _dim_bound(owner.operands[0], dynamic[0], batch_dims)
    if bound is None:
        return None
    scale = math.prod(inner[i] for i in groups[dim] if i != dynamic[0])
    return bound[0] * scale, bound[1] * scale, bound[2]


def _constant(value: ir.Value) -> int | None:
    owner = value.owner
    if not isinstance(owner, ir.Operation | ir.OpView) or owner.name != "arith.constant":
        return None
    return ir.IntegerAttr(owner.attributes["value"]).value


def _last_use(value: ir.Value, top_index: dict[ir.Operation, int]) -> int:
    """Position of the last top-level op that uses ``value`` or a view of it."""
    last, pending = -1, [value]
    while pending:
        for use in pending.pop().uses:
            owner = use.owner.operation
            last = max(last, top_index[owner])
            pending.extend(r for r in owner.results if isinstance(r.type, ir.MemRefType))
    return last


Foralls = list[tuple[ir.Operation, list[tuple[int, int, int]]]]  # (loop, (lower, step, trips) per variable)


def _task_slots(alloc: ir.Operation) -> tuple[int, Foralls] | None:
    """(slots, [(forall, [(lower, step, trips) per induction variable]) outermost first]) of a
    static-shaped allocation nested in loops: one slot per iteration of its ``scf.forall``
    loops, or None when it must stay on the heap (another enclosing op, dynamic loop bounds,
    or a view of it yielded by an enclosing ``scf.for``, i.e. live into the next iteration)."""
    kind = ir.MemRefType(alloc.result.type)
    if list(alloc.operands) or not kind.has_static_shape:
        return None
    loops, foralls, parent = [], [], alloc.parent.operation
    while parent.name != "func.func":
        if parent.name == "scf.for":
            loops.append(parent)
        elif parent.name == "scf.forall":
            bounds = [ir.DenseI64ArrayAttr(parent.attributes[f"static{k}"])
                      for k in ("LowerBound", "UpperBound", "Step")]
            if any(ir.ShapedType.is_dynamic_size(v) for attr in bounds for v in attr):
                return None
            foralls.append((parent, [(lo, st, -(-(hi - lo) // st)) for lo, hi, st in zip(*bounds)]))
        else:
            return None
        parent = parent.parent.operation
    pending = [alloc.result]
    while pending:
        for use in pending.pop().uses:
            owner = use.owner.operation
            if owner.name == "scf.yield" and owner.parent.operation in loops:
                return None
            pending.extend(r for r in owner.results if isinstance(r.type, ir.MemRefType))
    return math.prod(trips for _, ivs in foralls for *_, trips in ivs), foralls[::-1]


def _slot_index(foralls: Foralls) -> ir.Value | None:
    """The row-major number of the current iteration of ``foralls`` (outermost first), as index ops."""
    index = ir.IndexType.get()
    total = None
    for forall, ivs in foralls:
        for iv, (lower, step, trips) in zip(forall.regions[0].blocks[0].arguments, ivs):
            i = iv if lower == 0 else arith.subi(iv, arith.constant(index, lower))
            i = i if step == 1 else arith.divui(i, arith.constant(index, step))
            total = i if total is None else arith.addi(arith.muli(total, arith.constant(index, trips)), i)
    return total


def first_fit(lives: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets for (first, last, bytes) live ranges so that overlapping ranges never share
    bytes; returns (offsets, total bytes). Largest buffers are placed first, each at a
    multiple of its size's lowest set bit (at most ``ALIGN``)."""
    offsets = [0] * len(lives)
    placed: list[int] = []
    total = 0
    for i in sorted(range(len(lives)), key=lambda i: (-lives[i][2], lives[i][0])):
        first, last, size = lives[i]
        align = min(ALIGN, size & -size)  # a size's lowest set bit: its buffer's alignment
        busy = sorted((offsets[j], offsets[j] + lives[j][2]) for j in placed
                      if lives[j][0] <= last and first <= lives[j][1])
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, -(-hi // align) * align)
        offsets[i] = offset
        placed.append(i)
        total = max(total, offset + size)
    return offsets, total


def plan_memory(module: ir.Module, batch_dims: Collection[tuple[int, int]]) -> tuple[MemoryPlan, ir.Value]:
    """Rewrite the step's allocations into views of a new trailing workspace argument
    (``memref<?xi8>``). ``batch_dims`` lists the (argument, dim) pairs that hold the batch
    size. Returns the plan and the workspace value."""
    fn = entry_function(module)
    block = fn.regions[0].blocks[0]
    top_index: dict[ir.Operation, int] = {}
    top_ops = list(block.operations)
    for i, op in enumerate(top_ops):
        op.operation.walk(lambda nested, i=i: top_index.__setitem__(nested, i) or ir.WalkResult.ADVANCE)
    allocs = []
    tasks: dict[int, tuple[int, Foralls]] = {}  # alloc number -> (slot bytes, foralls) of the nested ones
    for nested, i in top_index.items():
        nested_alloc = nested.name == "memref.alloc" and nested.parent.operation.name != "func.func"
        slots = _task_slots(nested) if nested_alloc else None
        if slots is not None and (size := _element_bytes(ir.MemRefType(nested.result.type).element_type)):
            slot = round_up(size * math.prod(ir.MemRefType(nested.result.type).shape))
            tasks[len(allocs)] = (slot, slots[1])
            allocs.append((nested, 0, None, i, i, 0, slot * slots[0]))
    for i, op in enumerate(top_ops):
        if op.operation.name != "memref.alloc":
            continue
        kind = ir.MemRefType(op.result.type)
        size = _element_bytes(kind.element_type)
        bounds = [_bound(v, batch_dims) for v in op.operands]
        plain = kind.affine_map == ir.AffineMap.get_identity(kind.rank)
        exact = all(_is_batch(v, batch_dims) for v in op.operands)
        if size is None or not plain or None in bounds or (not exact and len(bounds) > 1):
            continue  # stays a heap allocation
        for d in kind.shape:
            size *= 1 if ir.ShapedType.is_dynamic_size(d) else d
        slope, intercept = (size * bounds[0][0], size * bounds[0][1]) if bounds else (Fraction(0), Fraction(size))
        per_row, fixed = _padded(math.ceil(slope), bool(bounds)), round_up(math.ceil(intercept))
        batch = bounds[0][2] if bounds else None
        allocs.append((op, len(bounds), batch, i, max(i, _last_use(op.result, top_index)), per_row, fixed))
    heap = sum(1 for o in top_index if o.name == "memref.alloc") - len(allocs)
    groups = max((a[1] for a in allocs), default=-1) + 1
    offsets: dict[int, tuple[int, int]] = {}
    group_bytes = []
    linear_fixed = 0
    for power in range(groups):
        members = [k for k, a in enumerate(allocs) if a[1] == power]
        if power == 1:
            placed, (total, linear_fixed) = first_fit_linear([allocs[k][3:] for k in members])
            offsets.update(zip(members, placed))
        else:  # static or exactly batch**power sized (fixed parts are zero but for power 0)
            placed, total = first_fit([(*allocs[k][3:5], allocs[k][5] if power else allocs[k][6]) for k in members])
            offsets.update((k, (o, 0) if power else (0, o)) for k, o in zip(members, placed))
        group_bytes.append(round_up(total))  # the next group starts on a cache line
    with module.context, fn.location:
        workspace = append_argument(fn, ir.MemRefType.get([ir.ShapedType.get_dynamic_size()],
                                                          ir.IntegerType.get_signless(8)))
        for k, (op, power, batch, *_rest) in enumerate(allocs):
            with ir.InsertionPoint(op), op.location:
                shift = _byte_offset(group_bytes, linear_fixed, power, offsets[k], batch)
                if k in tasks and (slot := _slot_index(tasks[k][1])) is not None:
                    shift = arith.addi(shift, arith.muli(slot, arith.constant(ir.IndexType.get(), tasks[k][0])))
                view = memref.view(op.result.type, workspace, shift, list(op.operands))
            op.result.replace_all_uses_with(view)
            op.erase()
    return MemoryPlan(tuple(group_bytes), len(allocs), heap, linear_fixed), workspace


# ops whose buffers the buffer-deallocation pipeline frees (an alloca is freed on return)
HEAP_OPS = frozenset({"memref.alloc", "memref.realloc", "bufferization.clone", "bufferization.alloc_tensor"})


def needs_deallocation(module: ir.Module) -> bool:
    """Whether some op of ``module`` still makes a heap buffer (after ``plan_memory``, one it
    could not place in the workspace): without one, the deallocation passes have nothing to do."""
    found = False

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        found = op.name in HEAP_OPS
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _padded(size: int, per_row: bool) -> int:
    """Whole cache lines, except per-row sizes under one (a 1-column buffer takes 4 bytes a
    row, not 64): those are padded to 16 or 4 bytes and aligned to that much."""
    return round_up(size) if not per_row or size >= ALIGN else -(-size // 16) * 16 if size > 4 else 4 if size else 0


def first_fit_linear(lives: list[tuple[int, int, int, int]]) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """Offsets ``a * batch + b`` as (a, b) for (first, last, per-row bytes, fixed bytes) live
    ranges, so that overlapping ranges never share bytes at any batch size: of two such
    buffers, one ends before the other starts in both parts. Returns (offsets, total)."""
    offsets: list[tuple[int, int]] = [(0, 0)] * len(lives)
    placed: list[int] = []
    total = (0, 0)
    for i in sorted(range(len(lives)), key=lambda i: (-lives[i][2], -lives[i][3], lives[i][0])):
        first, last, rows, fixed = lives[i]
        align = min([ALIGN, *(s & -s for s in (rows, fixed) if s)])
        busy = [(offsets[j], (offsets[j][0] + lives[j][2], offsets[j][1] + lives[j][3])) for j in placed
                if lives[j][0] <= last and first <= lives[j][1]]
        ends = [end for _, end in busy] + [(max((e[0] for _, e in busy), default=0),
                                            max((e[1] for _, e in busy), default=0))]
        candidates = sorted({(0, 0), *((-(-a // align) * align, -(-b // align) * align) for a, b in ends)})
        offsets[i] = next(c for c in candidates if all(
            (c[0] + rows <= lo[0] and c[1] + fixed <= lo[1]) or (hi[0] <= c[0] and hi[1] <= c[1]) for lo, hi in busy))
        placed.append(i)
        total = (max(total[0], offsets[i][0] + rows), max(total[1], offsets[i][1] + fixed))
    return offsets, (total[0], round_up(total[1]))


def _byte_offset(group_bytes: list[int], linear_fixed: int, power: int, offset: tuple[int, int],
                 batch: ir.Value | None) -> ir.Value:
    """HEADER + group_bytes[0] + (group_bytes[1] * batch + linear_fixed) + sum_{2<=j<power}
    group_bytes[j] * batch**j + offset[0] * batch**power + offset[1], as index ops."""
    index = ir.IndexType.get()
    fixed = HEADER + offset[1] + (group_bytes[0] if power else 0) + (linear_fixed if power > 1 else 0)
    total = arith.constant(index, fixed)
    if batch is None:
        return total
    scale = batch
    for j in range(1, power + 1):
        bytes_j = offset[0] if j == power else group_bytes[j]
        if bytes_j:
            total = arith.addi(total, arith.muli(scale, arith.constant(index, bytes_j)))
        if j < power:
            scale = arith.muli(scale, batch)
    return total
