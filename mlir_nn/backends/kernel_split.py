"""The step split into kernels: each piece of work of the bufferized step becomes its own function.

A step is one long function, which LLVM compiles on one core. Right before ``SPLIT_PASS``
the step's body is cut into pieces: runs of consecutive ops that do work (a linalg op, a
loop nest, a parallel loop, a copy, a chain of vector ops ending in a store) and whose
results are used only inside the piece. Each piece moves into a function of its own,
``k<hash of its text>``, that takes the values the piece reads (buffers, sizes) as
arguments; constants are copied in, so the kernel's loops keep static bounds. Views, sizes
and scalar arithmetic of them (the batch size's, run-time choices: ``_staying``) stay in the
step, and the kernels take their results as arguments. A small op
whose results several pieces read (``_shared``) stays in the step and is passed to each. The step
calls the kernels where the pieces were. A kernel's name is its content, so a repeated
piece is one kernel. The step and its kernels are grouped into chunks that run the rest of
the pipeline and LLVM on their own, in parallel (``kernel_build``, ``kernel_pool``).
Buffers that share no memory with another argument of their kernel are marked ``noalias``
(``NOALIAS``): without it LLVM versions each loop with runtime overlap checks.

A kernel takes each buffer as its aligned pointer and the offset, sizes and strides that its
type leaves dynamic (``_Layout``: a batch-major buffer is its pointer and the batch size), and
rebuilds the memref from them with the static ones as constants; the step calls it through
a declaration that takes the memrefs whole, and once lowered each call passes only those
fields (``pass_pointers``). A memref passed whole is its allocated and aligned pointers,
offset, sizes and strides: 16x256 Adam's step made 312 calls of up to 20 arguments, whose
extraction and passing was a third of its LLVM time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import func

from mlir_nn.backends.memory_plan import entry_function
from mlir_nn.codegen.walk import symbol

SPLIT_PASS = "scf-forall-to-parallel"  # the first pass that kernels run on their own
KERNEL_PREFIX = "k"
# on a kernel: positions, among its arguments in LLVM's calling convention (a memref is its
# allocated and aligned pointers, offset, sizes and strides), of the aligned pointers that
# kernel_build marks ``noalias``
NOALIAS = "mlir_nn.noalias"
# pure ops that stay where they are: the kernels take their results as arguments
_STAY = frozenset({"memref.view", "memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.cast",
                   "memref.reinterpret_cast", "memref.dim", "memref.extract_strided_metadata"})
_CONSTANTS = frozenset({"arith.constant", "ub.poison"})  # copied into each kernel that reads them
# ops that end a piece and stay in the step: they refer to symbols, set the FP state, or branch
_BARRIERS = frozenset({"func.call", "func.return", "scf.yield", "scf.if", "memref.alloca_scope", "memref.alloc",
                       "memref.alloca", "memref.dealloc", "memref.get_global"})


# ops that refer to symbols of the step's module: work containing one stays in the step (the
# intrinsics, loads and stores that set the FP state in a parallel loop's body move along)
_SYMBOL_USERS = frozenset({"func.call", "llvm.call", "llvm.mlir.addressof", "memref.get_global"})


@dataclass
class Split:
    """The step's function (calling ``kernels``, with the module's other ops: its constant
    globals) and the text of each distinct kernel (``declarations``: how the step declares them)."""

    step_name: str
    step: str
    kernels: dict[str, str]
    declarations: dict[str, str]

    def chunks(self, count: int) -> list[Chunk]:
        """The step and its kernels in at most ``count`` modules of about equal cost."""
        return self._groups([(self.step_name, self.step)] + sorted(self.kernels.items()), count, True)

    def apart(self, kernels: Collection[str], count: int) -> list[Chunk]:
        """The step in a module of its own, then the ``kernels`` in at most ``count`` modules:
        objects that call no kernel of another, which other steps can link. The modules are of
        about equal cost with the step's counted in the last, so that the processor which builds
        the cheapest module builds the step too (``kernel_pool`` hands the largest out first)."""
        step = self._chunk([(self.step_name, self.step)])
        members = sorted((name, self.kernels[name]) for name in kernels)
        return [step] + (self._groups(members, count, False, _cost(self.step)) if members else [])

    def _groups(self, members: list[tuple[str, str]], count: int, whole: bool, beside: int = 0) -> list[Chunk]:
        """``members`` in at most ``count`` chunks; ``whole``: one chunk would be the step's only one;
        ``beside``: the cost of other work that the processor of the last chunk does too (none
        of them empty: with a costly ``beside`` fewer)."""
        members.sort(key=lambda m: -_cost(m[1]))
        groups: list[list[tuple[str, str]]] = [[] for _ in range(max(1, min(count, len(members))))]
        costs = [0] * (len(groups) - 1) + [beside]
        for member in members:
            cheapest = costs.index(min(costs))
            groups[cheapest].append(member)
            costs[cheapest] += _cost(member[1])
        return [self._chunk(sorted(group), whole and len(groups) == 1) for group in groups if group]

    def _chunk(self, members: list[tuple[str, str]], whole: bool = False) -> Chunk:
        names = [name for name, _ in members]
        public = [name for name in names if name != self.step_name]
        calls: tuple[str, ...] = ()
        declarations = ""
        step = ""
        if self.step_name in names:  # it calls every kernel: declare those compiled elsewhere
            step = self.step_name
            public.insert(0, "_mlir_ciface_" + step)
            calls = tuple(name for name in self.kernels if name not in names)
            declarations = "".join(self.declarations[name] + "\n" for name in calls)
        text = "module {\n" + declarations + "\n".join(body for _, body in members) + "\n}\n"
        return Chunk(text, tuple(public), calls, whole, tuple(public[1:] if step else public), step)


def _cost(text: str) -> int:
    """A kernel's LLVM work, roughly: its text's length (a parallel loop's body is compiled once,
    ``parallel_bodies``)."""
    return len(text)


@dataclass(frozen=True)
class Chunk:
    """A module of kernels (perhaps with the step): ``public`` are its functions that others
    call (the step's C interface first, when it holds the step), ``calls`` the kernels it
    calls that other chunks define; ``whole``: the only chunk of its step (no other chunk's
    names to clash with); ``kernels``: the kernels it defines; ``step``: the name of the step
    it defines, or "" (the step itself is internal: see ``kernel_build.inline_step``)."""

    text: str
    public: tuple[str, ...]
    calls: tuple[str, ...]
    whole: bool = False
    kernels: tuple[str, ...] = ()
    step: str = ""


def _ops(block: ir.Block) -> list[ir.Operation]:
    return [op.operation for op in block.operations]


def _nested(op: ir.Operation) -> list[ir.Operation]:
    """``op`` and every op inside it."""
    found: list[ir.Operation] = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        found.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


_SCALARS = (ir.IndexType, ir.IntegerType, ir.FloatType)
_INTEGERS = (ir.IndexType, ir.IntegerType)


def _scalar_arithmetic(op: ir.Operation) -> bool:
    """An ``arith`` op or ``affine.apply`` of scalars with index or integer results: index
    arithmetic of the batch size, compares (i1), selects, casts. (Float results stay in the
    pieces that read them: a kernel keeps its scale factors.)"""
    if not (op.name.startswith("arith.") or op.name == "affine.apply") or op.regions or not op.results:
        return False
    return (all(isinstance(value.type, _SCALARS) for value in op.operands)
            and all(isinstance(value.type, _INTEGERS) for value in op.results))


def _staying(fn: ir.Operation) -> dict[ir.Operation, bool]:
    """For each op of the step's entry block and of its ``scf.if`` then-blocks (``_blocks``):
    whether it is a pure op that stays in the step. Views and sizes do; so does scalar arithmetic
    (``_scalar_arithmetic``) of values that stay too (arguments, constants, other such ops). Scalar
    arithmetic that reads a piece's value goes into that piece: staying, it would keep the piece
    from ever closing, and an i1 compare left as work whose reader (an index select) stays kept
    every op after it inline in the step, run serially."""
    stays: dict[ir.Operation, bool] = {}

    def staying_value(value: ir.Value) -> bool:
        owner = value.owner
        if not isinstance(owner, ir.OpView | ir.Operation):
            return True  # a block argument
        return owner.operation.name in _CONSTANTS or stays.get(owner.operation, False)

    def visit(block: ir.Block) -> None:
        for op in _ops(block):
            stays[op] = op.name in _STAY or (_scalar_arithmetic(op) and all(map(staying_value, op.operands)))
            if op.name == "scf.if" and block == entry:
                visit(op.regions[0].blocks[0])

    entry = fn.regions[0].blocks[0]
    visit(entry)
    return stays


def _is_work(op: ir.Operation, stays: dict[ir.Operation, bool]) -> bool:
    if stays[op] or op.name in _CONSTANTS or op.name in _BARRIERS or op.name.startswith("llvm."):
        return False
    return not any(o.name in _SYMBOL_USERS for o in _nested(op))


def _top_level(op: ir.Operation, block: ir.Block) -> ir.Operation | None:
    """The ancestor of ``op`` (itself included) that sits in ``block``, or None."""
    while op is not None:
        if op.block == block:
            return op
        parent = op.parent
        op = parent.operation if parent is not None and parent.name != "builtin.module" else None
    return None


def _shared(ops: list[ir.Operation], block: ir.Block, work: dict[ir.Operation, bool]) -> set[ir.Operation]:
    """Work ops without regions whose results several later work ops read (a read of a zero
    start vector that CSE shared between the bias-gradient sums of every layer): they stay
    in the step, where they are, and the pieces that read them take their results as
    arguments. A piece that held one would reach to its last reader: one kernel of all the
    work in between (136 ops, 6 s of LLVM). ``work``: ``_is_work`` of each op of ``block``."""
    found = set()
    for op in ops:
        if op.regions or not op.results or not work[op]:
            continue
        users = {_top_level(use.owner.operation, block) for result in op.results for use in result.uses}
        if len({user for user in users if user is not None and work[user]}) >= 2:
            found.add(op)
    return found


def _pieces(block: ir.Block, stays: dict[ir.Operation, bool]) -> list[tuple[list[ir.Operation], ir.Operation]]:
    """Runs of work ops of ``block`` whose results are used only inside the run, shortest
    first, each with the op that follows it (a block ends in its terminator). ``stays``:
    ``_staying``."""
    ops = _ops(block)
    position = {op: i for i, op in enumerate(ops)}
    work = {op: _is_work(op, stays) for op in ops}  # once each: a product's walk, not again per use of its results
    shared = _shared(ops, block, work)
    pieces, current, reach = [], [], -1
    for i, op in enumerate(ops):
        if not work[op] or op in shared:
            if not stays[op] and op.name not in _CONSTANTS:
                current, reach = [], -1  # a barrier: an open piece stays where it is
            continue
        current.append(op)
        for result in op.results:
            for use in result.uses:
                user = _top_level(use.owner.operation, block)
                if user is None or not work[user]:
                    reach = len(ops)  # read outside the block, or by an op that stays: never closes
                else:
                    reach = max(reach, position[user])
        if reach <= i:
            pieces.append((current, ops[i + 1]))
            current, reach = [], -1
    return pieces


def _blocks(fn: ir.Operation) -> list[ir.Block]:
    """The entry block and the then-blocks of its ``scf.if`` ops (the input guard's body)."""
    entry = fn.regions[0].blocks[0]
    blocks = [entry]
    for op in _ops(entry):
        if op.name == "scf.if":
            blocks.append(op.regions[0].blocks[0])
    return blocks


Read = tuple[ir.Operation, int, ir.Value]  # an op of a piece, an operand position, the value it reads there


def _outside_reads(fn: ir.Operation, block: ir.Block, pieces: list[list[ir.Operation]]) -> list[list[Read]]:
    """For each of the ``pieces`` of ``block``: where it reads values defined outside it (op,
    operand position, value), in the walk order of its ops (post-order) and operand order.
    Found from the uses of the values that a piece can read (the arguments and top-level
    results of ``block`` and of the entry block, but for the pieces' own), not by reading
    every operand of every op of the pieces (56k operands of 12k ops at 16x256 Adam, 5k of
    them outside reads: 0.16 s)."""
    owner = {op: k for k, piece in enumerate(pieces) for op in piece}
    entry = fn.regions[0].blocks[0]
    values: list[ir.Value] = []
    for scope in [block] if block == entry else [block, entry]:
        values.extend(scope.arguments)
        for op in _ops(scope):
            if op not in owner:
                values.extend(op.results)
    reads: list[list[Read]] = [[] for _ in pieces]
    for value in values:
        for use in value.uses:
            user = use.owner.operation
            top = _top_level(user, block)
            if top is not None and top in owner:
                reads[owner[top]].append((user, use.operand_number, value))
    for k, piece in enumerate(pieces):
        if len(reads[k]) > 1:
            order = {op: i for i, op in enumerate(inner for op in piece for inner in _nested(op))}
            reads[k].sort(key=lambda read: (order[read[0]], read[1]))
    return reads


_PLACEHOLDER_NAME = "kernel"  # a kernel's name while its text is hashed
_PREFIX = "mlirnn_"  # of the names of a kernel's pointer arguments and its rebuilt descriptors
# the step calls kernel k through a declaration k + DESCRIPTORS that takes the memrefs whole;
# PASSED on it: the positions, among those arguments in LLVM's calling convention, of the
# ones that k takes (``pass_pointers``)
DESCRIPTORS = "_d"
PASSED = "mlir_nn.passed"

_VIEWS = frozenset({"memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.cast",
                    "memref.reinterpret_cast"})


def root_buffer(value: ir.Value) -> ir.Value:
    """The buffer a memref value views: a step argument, an allocation or a workspace view."""
    while isinstance(value.owner, ir.OpView | ir.Operation) and value.owner.name in _VIEWS:
        value = value.owner.operands[0]
    return value


def aligned_pointer_positions(values: list[ir.Value]) -> list[int | None]:
    """For each of ``values`` passed to a function taking memrefs (a parallel task): the
    position, among the function's arguments in LLVM's calling convention, of its aligned
    pointer if it is a memref (its descriptor is the allocated and aligned pointers, offset,
    sizes and strides), else None (one argument)."""
    positions: list[int | None] = []
    position = 0
    for value in values:
        memref = isinstance(value.type, ir.MemRefType)
        positions.append(position + 1 if memref else None)
        position += 3 + 2 * ir.MemRefType(value.type).rank if memref else 1
    return positions


@dataclass(frozen=True)
class _Layout:
    """How a kernel takes a buffer of memref type ``type``: its aligned pointer, then its offset,
    sizes and strides that the type leaves dynamic (``fields``: (descriptor position, dim) each),
    as i64; the kernel rebuilds the descriptor with the static ones as constants."""

    type: ir.MemRefType
    fields: tuple[tuple[int, int], ...]
    static: tuple[tuple[int, int, int], ...]  # (descriptor position, dim, value)

    @staticmethod
    def of(memref: ir.MemRefType) -> _Layout:
        dynamic = ir.ShapedType.get_dynamic_size()
        strides, offset = memref.get_strides_and_offset()
        entries = [(2, -1, offset)] + [(3, d, n) for d, n in enumerate(memref.shape)] + \
            [(4, d, n) for d, n in enumerate(strides)]
        return _Layout(memref, tuple((k, d) for k, d, n in entries if n == dynamic),
                       tuple((k, d, n) for k, d, n in entries if n != dynamic))

    def argument_types(self) -> list[ir.Type]:
        return [ir.Type.parse("!llvm.ptr")] + [ir.IntegerType.get_signless(64)] * len(self.fields)

    def passed(self) -> list[int]:
        """The positions, among the buffer's descriptor fields in LLVM's calling convention
        (allocated and aligned pointers, offset, sizes, strides), of those the kernel takes."""
        rank = self.type.rank
        return [1] + [2 if k == 2 else 3 + d + (rank if k == 4 else 0) for k, d in self.fields]

    def rebuilt(self, name: str, given: list[str]) -> list[str]:
        """Lines that define the memref ``name`` again from the names ``given`` of the arguments
        the kernel takes for it (its pointer, then its dynamic fields)."""
        rank = self.type.rank
        arrays = f", array<{rank} x i64>, array<{rank} x i64>" if rank else ""
        descriptor = f"!llvm.struct<(ptr, ptr, i64{arrays})>"
        stem = f"%{_PREFIX}d{name[1:]}"
        lines = [f"{stem}_c{j} = llvm.mlir.constant({n} : i64) : i64" for j, (_, _, n) in enumerate(self.static)]
        values = [((0, -1), given[0]), ((1, -1), given[0])]
        values += [((k, d), f"{stem}_c{j}") for j, (k, d, _) in enumerate(self.static)]
        values += list(zip(self.fields, given[1:]))
        lines.append(f"{stem}_0 = llvm.mlir.poison : {descriptor}")
        for i, ((k, d), value) in enumerate(values):
            where = f"{k}" if d < 0 else f"{k}, {d}"
            lines.append(f"{stem}_{i + 1} = llvm.insertvalue {value}, {stem}_{i}[{where}] : {descriptor}")
        lines.append(f"{name} = builtin.unrealized_conversion_cast {stem}_{len(values)} : {descriptor} to {self.type}")
        return lines


def _pointer_positions(arguments: list[ir.Value]) -> list[int | None]:
    """For each of a kernel's ``arguments``: the position among the arguments it takes
    (``_Layout``) of the buffer's pointer, or None when it is no buffer."""
    positions: list[int | None] = []
    position = 0
    for value in arguments:
        buffer = isinstance(value.type, ir.MemRefType)
        positions.append(position if buffer else None)
        position += 1 + len(_Layout.of(ir.MemRefType(value.type)).fields) if buffer else 1
    return positions


def _mark_noalias(kernel: func.FuncOp, arguments: list[ir.Value], single_op: bool) -> None:
    """Mark the buffers that no other argument shares memory with (``NOALIAS``: the positions of
    their pointers among the arguments the kernel takes), so that LLVM needs no runtime overlap
    checks. Distinct step arguments are distinct arrays (the backend
    checks parameters, copies inputs that overlap one, allocates outputs); workspace views
    used by one op are live together, so the memory plan gave them disjoint bytes (a piece of
    several ops may read a buffer whose bytes a later op of it reuses: those stay unmarked)."""
    roots = [root_buffer(v) if isinstance(v.type, ir.MemRefType) else None for v in arguments]
    marked = []
    for i, (root, position) in enumerate(zip(roots, _pointer_positions(arguments), strict=True)):
        shared = root is None or any(r is not None and r == root for j, r in enumerate(roots) if j != i)
        view = root is not None and isinstance(root.owner, ir.OpView | ir.Operation)
        if not shared and (single_op or not view):
            marked.append(position)
    if marked:
        kernel.attributes[NOALIAS] = ir.DenseI64ArrayAttr.get(marked)


def kernel_buffers(kernel: ir.Operation) -> dict[ir.Value, int]:
    """The buffers of a kernel made by ``split_step``: each memref that the kernel rebuilt from
    its arguments, with the position of its pointer among them."""
    found = {}
    for op in _ops(kernel.regions[0].blocks[0]):
        if op.name != "builtin.unrealized_conversion_cast" or not isinstance(op.results[0].type, ir.MemRefType):
            continue
        inserted = op.operands[0].owner
        while inserted.name == "llvm.insertvalue":
            if list(ir.DenseI64ArrayAttr(inserted.attributes["position"])) == [1]:
                found[op.results[0]] = ir.BlockArgument(inserted.operands[1]).arg_number
                break
            inserted = inserted.operands[0].owner
    return found


def _outline(piece: list[ir.Operation], reads: list[Read], scratch: ir.Module) -> tuple[str, str, list[ir.Value]]:
    """Move ``piece`` into a function of ``scratch`` that takes the values it reads (``reads``:
    ``_outside_reads``) as they are, in first-use order: (name, the function's text, its
    arguments). The name hashes the text, printed once."""
    values = list(dict.fromkeys(value for _, _, value in reads))
    constants = [v for v in values if isinstance(v.owner, ir.OpView | ir.Operation) and v.owner.name in _CONSTANTS]
    constant_set = set(constants)
    arguments = [v for v in values if v not in constant_set]
    with ir.InsertionPoint(scratch.body), piece[0].location:
        kernel = func.FuncOp(_PLACEHOLDER_NAME, ([v.type for v in arguments], []))
        entry = kernel.add_entry_block()
        with ir.InsertionPoint(entry):
            end = func.ReturnOp([])
    replacement: dict[ir.Value, ir.Value] = dict(zip(arguments, entry.arguments))
    for value in constants:
        replacement[value] = value.owner.operation.clone(ir.InsertionPoint(end)).results[0]
    _mark_noalias(kernel, arguments, len(piece) == 1)
    for op in piece:
        op.move_before(end)
    for inner, k, value in reads:
        inner.operands[k] = replacement[value]
    text = kernel.operation.get_asm(assume_verified=True)  # (str() verifies each kernel: a sixth of split_step)
    return KERNEL_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:24], text, arguments


def _taking_pointers(text: str, arguments: list[ir.Value], layouts: list[_Layout | None]) -> str:
    """The printed kernel ``text`` (``_outline``: it takes its ``arguments`` as they are) made to
    take each buffer as its layout says, rebuilt at the start of its body under the name of
    the argument it was."""
    header = f"func.func @{_PLACEHOLDER_NAME}(" + ", ".join(f"%arg{i}: {v.type}" for i, v in enumerate(arguments))
    if not text.startswith(header + ")"):
        raise ValueError(f"kernel_split: unexpected kernel header {text.splitlines()[0][:200]!r}")
    taken, prologue = [], []
    for i, (value, layout) in enumerate(zip(arguments, layouts)):
        if layout is None:
            taken.append(f"%arg{i}: {value.type}")
            continue
        given = [f"%{_PREFIX}p{i}"] + [f"%{_PREFIX}f{i}_{j}" for j in range(len(layout.fields))]
        taken += [f"{given[0]}: !llvm.ptr"] + [f"{g}: i64" for g in given[1:]]
        prologue += layout.rebuilt(f"%arg{i}", given)
    first, rest = text[len(header):].split("\n", 1)
    body = "".join(f"  {line}\n" for line in prologue)
    return f"func.func @{_PLACEHOLDER_NAME}(" + ", ".join(taken) + first + "\n" + body + rest


def _passed_positions(layouts: list[_Layout | None]) -> list[int]:
    """The positions, among a kernel's arguments in LLVM's calling convention (each memref as
    its descriptor's fields), of those it takes (``layouts``: each argument's, None for no memref)."""
    positions, start = [], 0
    for layout in layouts:
        positions += [start + k for k in layout.passed()] if layout else [start]
        start += 3 + 2 * layout.type.rank if layout else 1
    return positions


def split_step(module: ir.Module) -> Split:
    """Outline the work of the step in ``module`` into kernels (see the module docstring)."""
    kernels: dict[str, str] = {}
    declarations: dict[str, str] = {}
    with module.context:
        fn = entry_function(module)
        stays = _staying(fn)
        for block in _blocks(fn):
            pieces = _pieces(block, stays)
            reads = _outside_reads(fn, block, [piece for piece, _ in pieces])
            for (piece, after), read in zip(pieces, reads, strict=True):
                name, text, arguments = _outline(piece, read, ir.Module.create(piece[0].location))
                with ir.InsertionPoint(after), after.location:
                    func.CallOp([], ir.FlatSymbolRefAttr.get(name + DESCRIPTORS), arguments)
                if name in kernels:
                    continue
                # the first of its kind takes pointers, is named and printed; the step calls it
                # through a declaration that takes its arguments as they are (``pass_pointers``)
                layouts = [_Layout.of(ir.MemRefType(v.type)) if isinstance(v.type, ir.MemRefType) else None
                           for v in arguments]
                with ir.InsertionPoint(fn), fn.location:
                    through = func.FuncOp(name + DESCRIPTORS, ([v.type for v in arguments], []), visibility="private")
                    through.attributes[PASSED] = ir.DenseI64ArrayAttr.get(_passed_positions(layouts))
                kernels[name] = _taking_pointers(text, arguments, layouts).replace(
                    f"func.func @{_PLACEHOLDER_NAME}(", f"func.func @{name}(", 1)
                types = [t for v, layout in zip(arguments, layouts)
                         for t in (layout.argument_types() if layout else [v.type])]
                apart = ir.Module.create(fn.location)  # printed in a module of its own: fast
                with ir.InsertionPoint(apart.body), fn.location:
                    declaration = func.FuncOp(name, (types, []), visibility="private")
                declarations[name] = declaration.operation.get_asm(assume_verified=True)
        # with its globals (constants); each op printed in its own scope, not the module's
        step = "\n".join(op.get_asm(use_local_scope=True, assume_verified=True) for op in _ops(module.body))
        return Split(ir.StringAttr(fn.attributes["sym_name"]).value, step, kernels, declarations)


def _call_taking(call: ir.Operation, callee: str, positions: list[int]) -> None:
    """Replace the ``llvm.call`` ``call`` by a call of ``callee`` with its operands at ``positions``."""
    operands = list(call.operands)
    kept = [operands[k] for k in positions]
    attributes = {name: call.attributes[name] for name in call.attributes}
    attributes["callee"] = ir.FlatSymbolRefAttr.get(callee)
    attributes["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get([len(kept), 0])
    ir.Operation.create("llvm.call", [], kept, attributes, loc=call.location, ip=ir.InsertionPoint(call))
    call.erase()


def pass_pointers(module: ir.Module, step: str) -> None:
    """In the lowered ``module``: the calls of the function ``step`` through the declarations
    ``<kernel>`` + DESCRIPTORS, which pass every memref as all its descriptor's fields, call
    the kernel itself with the fields it takes (PASSED) instead; those declarations go."""
    with module.context:
        through = {symbol(op): op for op in _ops(module.body) if op.name == "llvm.func" and PASSED in op.attributes}
        if not through:
            return
        positions = {name: list(ir.DenseI64ArrayAttr(op.attributes[PASSED])) for name, op in through.items()}
        fn = next(op for op in _ops(module.body) if symbol(op) == step)
        for block in fn.regions[0].blocks:
            for op in _ops(block):
                direct = op.name == "llvm.call" and "callee" in op.attributes
                callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value if direct else None
                if callee in through:
                    _call_taking(op, callee[:-len(DESCRIPTORS)], positions[callee])
        for op in through.values():
            op.erase()
