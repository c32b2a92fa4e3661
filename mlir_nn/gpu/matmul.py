"""Register-tiled float32 products: one kernel per fill + contraction (+ epilogue), written as loops.

After bufferization a fused node of the optimized Graph (``linear``, ``gemm``,
``matmul_relu_grad``, ``matmul``) is three adjacent ``linalg.generic`` ops on one
output buffer C: a fill, the contraction ``C[m, n] += A * B`` (either operand may be
transposed) and maybe an element-wise epilogue that reads C through its ``outs``
argument (``mlir_nn.gpu.fusion.tag_groups`` rewrote it so). ``register_tile`` replaces
each such group by the loops of one kernel, in the form the rest of the pipeline maps to
the GPU (an ``scf.parallel`` block loop holding one ``scf.forall`` thread loop):

* a block of 16 x 16 threads computes a ``bm x bn`` tile of C; each thread keeps a
  ``tm x tn`` tile of accumulators in registers (loop-carried values) across the whole
  K loop, starting from the fill value. Two tilings (``Tiling``): 128 x 128 with 8 x 8
  per thread (K steps of 8) for large products, 64 x 64 with 4 x 4 (K steps of 16)
  otherwise. The rule (``tiling_for``): the large tile when it still gives every one of
  the H200's 132 SMs a block, ``ceil(M / 128) * ceil(N / 128) >= 132``. It is decided
  while compiling when M and N are static; when one is the batch both kernels are
  built and the host picks one per call (the other gets an empty grid, which the launch
  plan drops);
* A's ``bm x bk`` and B's ``bk x bn`` tiles are staged in shared memory (both stored
  K-major, rows padded by ``PAD``, zero outside the matrices), each thread bringing 4
  elements of each per K step. How depends on the operand's layout (``Operand.path``): a K-major operand whose
  rows are a multiple of 4 floats long is copied as it is with one 16-byte ``cp.async``
  (``nvgpu.device_async_copy``, zero-filled outside the matrix); one stored along K is
  read with one 128-bit global load into registers and stored transposed; any other
  (row length not a multiple of 4, or dynamic) is read with guarded scalar loads. The
  vector paths rely on every buffer starting 16-byte aligned (each is its own allocation;
  the SIMT interpreter reports a misaligned vector access);
* the shared buffers are doubled: while a K step computes from one, the next step's
  copies into the other are in flight and its register-staged values are loaded; those
  are stored after the product, then the thread waits for its copies
  (``nvgpu.device_async_wait``) and one barrier closes the step;
* per k each thread reads ``tm`` values of A and ``tn`` of B (128-bit shared loads, its 8
  rows or columns as two groups of 4 half a tile apart) for ``tm * tn`` multiply-adds
  (``fma.rn.f32`` with ``fastmath<contract>``);
* the epilogue (bias, ReLU, the ReLU-gradient mask, ``W - lr * grad``) is applied to the
  accumulators in registers and each result stored once, inside the matrix bounds.

Convolutions are implicit GEMMs: an operand gathered into a buffer by all-parallel generics
(padding, im2col columns, an output gradient's pixel rows or spread, a flipped weight) is
computed in place from their bodies (``mlir_nn.gpu.gathers``; always the guarded scalar
path), and a result moved to NCHW by a permuting copy, or updated in place by an
element-wise op right after (bias and ReLU, a folded weight update), is stored through it
(``mlir_nn.gpu.scatters``).

All targets (sm_80 and later) have ``cp.async``. The SIMT interpreter
(``mlir_nn.gpu.simt``) checks these kernels, the async copies included; the CPU emulation
of the schedule (``mlir_nn.gpu.emulate``) runs the 16x16 shared-memory schedule instead,
which float64 products still use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlir.dialects import arith, memref, nvgpu, scf, vector
from mlir.dialects import gpu as gpu_dialect
from mlir.ir import (
    AffineDimExpr,
    AffineMapAttr,
    ArrayAttr,
    Attribute,
    DenseElementsAttr,
    F32Type,
    FloatAttr,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    MemRefType,
    Operation,
    StringAttr,
    UnitAttr,
    Value,
    VectorType,
)

from mlir_nn.gpu.gathers import Gather, find_gather
from mlir_nn.gpu.scatters import Scatter, find_scatter
from mlir_nn.gpu.schedule import MATMUL, NODE, clone_body, is_contraction, iterator_kinds

THREADS = (16, 16)  # (y, x) threads of every product's block
VECTOR = 4  # floats per 128-bit global load or 16-byte async copy
SMS = 132  # streaming multiprocessors of an H200
PAD = 4  # floats after each shared tile row: transposed stores spread over more banks, rows stay 16-byte aligned


@dataclass(frozen=True)
class Tiling:
    """A block computes ``bm x bn`` of C in K steps of ``bk``; each thread a ``tm x tn`` tile."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    def per_thread(self, tile: int) -> int:
        """Elements of a ``tile x bk`` operand tile each thread brings per K step."""
        return tile * self.bk // (THREADS[0] * THREADS[1])


SMALL = Tiling(64, 64, 16, 4, 4)
LARGE = Tiling(128, 128, 8, 8, 8)
for _t in (SMALL, LARGE):
    assert (_t.bm // _t.tm, _t.bn // _t.tn) == THREADS and _t.per_thread(_t.bm) % VECTOR == 0


def tiling_for(rows: int, cols: int) -> Tiling:
    """``LARGE`` for an M x N output when its tiles still give every SM a block,
    ``ceil(M / 128) * ceil(N / 128) >= SMS``, else ``SMALL``."""
    return LARGE if -(-rows // LARGE.bm) * -(-cols // LARGE.bn) >= SMS else SMALL


@dataclass
class Product:
    fill: Operation
    contraction: Operation
    epilogue: Operation | None
    a: Value
    b: Value
    c: Value
    a_k_major: bool  # A is indexed (k, m), i.e. transposed
    b_n_major: bool  # B is indexed (n, k), i.e. transposed
    a_gather: Gather | None = None  # A read through the copy that gathered it (mlir_nn.gpu.gathers)
    b_gather: Gather | None = None
    scatter: Scatter | None = None  # C stored through the copy that moves it (mlir_nn.gpu.scatters)


def _dims(attr: Attribute) -> list[int] | None:
    out = []
    for expr in AffineMapAttr(attr).value.results:
        expr = expr.maybe_downcast()
        if not isinstance(expr, AffineDimExpr):
            return None
        out.append(expr.position)
    return out


def _is_fill_of(op: Operation, c: Value) -> bool:
    body = [o.operation for o in op.regions[0].blocks[0].operations]
    return (op.name == "linalg.generic" and len(op.operands) == 2 and op.operands[1] == c
            and not isinstance(op.operands[0].type, MemRefType) and len(body) == 1
            and body[0].operands[0] == op.regions[0].blocks[0].arguments[0])


def _is_epilogue_of(op: Operation, c: Value) -> bool:
    """All-parallel, writes C at (d0, d1) and reads it only through its ``outs`` argument."""
    if op.name != "linalg.generic" or "reduction" in iterator_kinds(op) or len(iterator_kinds(op)) != 2:
        return False
    n_in, n_out = list(op.attributes["operandSegmentSizes"])
    maps = [_dims(a) if isinstance(v.type, MemRefType) else [] for a, v in
            zip(ArrayAttr(op.attributes["indexing_maps"]), op.operands)]
    return (n_out == 1 and op.operands[n_in] == c and maps[n_in] == [0, 1]
            and all(m is not None for m in maps) and c not in list(op.operands)[:n_in])


def find_products(func: Operation) -> list[Product]:
    """Every float32 fill + contraction (+ epilogue) group of ``func``'s top level (see the module docstring)."""
    block_ops = [o.operation for o in func.regions[0].blocks[0].operations]
    ops = [o for o in block_ops if o.name.startswith("linalg.")]
    found = []
    for i, op in enumerate(ops):
        if op.name != "linalg.generic" or not is_contraction(op, iterator_kinds(op)) or i == 0:
            continue
        a, b, c = op.operands
        maps = [_dims(m) for m in ArrayAttr(op.attributes["indexing_maps"])]
        if str(MemRefType(c.type).element_type) != "f32" or maps[2] != [0, 1] or not _is_fill_of(ops[i - 1], c):
            continue
        if maps[0] not in ([0, 2], [2, 0]) or maps[1] not in ([2, 1], [1, 2]):
            continue
        body = [o.operation for o in op.regions[0].blocks[0].operations]
        args = list(op.regions[0].blocks[0].arguments)
        if list(body[0].operands) != args[:2] or list(body[1].operands) != [args[2], body[0].results[0]]:
            continue  # out + a * b in this order, so the result rounds like the reference
        epilogue = ops[i + 1] if i + 1 < len(ops) and _is_epilogue_of(ops[i + 1], c) else None
        product = Product(ops[i - 1], op, epilogue, a, b, c, maps[0] == [2, 0], maps[1] == [1, 2],
                          find_gather(a, op, block_ops), find_gather(b, op, block_ops))
        found.append((product, find_scatter(c, op, [o for o in (ops[i - 1], op, epilogue) if o], block_ops)))
    moved: list[Operation] = []
    for product, scatter in found:  # once every product is found: moving ops reorders the block
        if scatter is not None:
            product.scatter = scatter[0]
            for o in scatter[1]:
                if o not in moved:
                    o.move_before(product.fill)
                    moved.append(o)
    return [product for product, _ in found]


def _index(v: int) -> Value:
    return arith.constant(IndexType.get(), v)


def _dim(v: Value, axis: int) -> Value:
    """Extent of ``axis`` of ``v``: static, the allocation's size operand, else a ``memref.dim``."""
    t = MemRefType(v.type)
    if not t.is_dynamic_dim(axis):
        return _index(t.shape[axis])
    owner = v.owner.operation if hasattr(v.owner, "operation") else None
    if owner is not None and owner.name == "memref.alloc":
        return owner.operands[sum(t.is_dynamic_dim(i) for i in range(axis))]
    return memref.dim(v, _index(axis))


def _ult(a: Value, b: Value) -> Value:
    return arith.cmpi(arith.CmpIPredicate.ult, a, b)


def _guarded_load(read: Callable[[Value, Value], Value], row: Value, col: Value, rows: Value, cols: Value) -> Value:
    """``read(row, col)`` inside the matrix, else 0."""
    f32 = F32Type.get()
    branch = scf.IfOp(arith.andi(_ult(row, rows), _ult(col, cols)), [f32], has_else=True)
    with InsertionPoint(branch.then_block):
        scf.YieldOp([read(row, col)])
    with InsertionPoint(branch.else_block):
        scf.YieldOp([arith.constant(f32, 0.0)])
    return branch.results[0]


def _guarded_vector_load(source: Value, row: Value, col: Value, rows: Value, cols: Value) -> Value:
    """``source[row, col:col + 4]`` (one 128-bit load) inside the matrix, else zeros; the caller
    makes sure ``col`` and the row length are multiples of 4, so a vector is all in or all out."""
    vtype = VectorType.get([VECTOR], F32Type.get())
    branch = scf.IfOp(arith.andi(_ult(row, rows), _ult(col, cols)), [vtype], has_else=True)
    with InsertionPoint(branch.then_block):
        scf.YieldOp([vector.load(vtype, source, [row, col], alignment=4 * VECTOR)])
    with InsertionPoint(branch.else_block):
        zeros = DenseElementsAttr.get_splat(vtype, FloatAttr.get(F32Type.get(), 0.0))
        scf.YieldOp([arith.constant(vtype, zeros)])
    return branch.results[0]


@dataclass
class Operand:
    """One input of a product as a block sees it: ``tile`` of its non-K index ``i`` from ``base``."""

    source: Value  # the matrix in global memory
    k_major: bool  # indexed source[k, i] (tiles go to shared memory as they are), else source[i, k]
    base: Value  # first i of the block
    extent: Value  # the size of i
    k_size: Value
    tile: int  # bm or bn
    gather: Gather | None = None  # read through the window indexing instead of ``source``

    @property
    def path(self) -> str:
        """"async" (16-byte cp.async), "vector" (128-bit loads, stored transposed) or "scalar"."""
        t = MemRefType(self.source.type)
        if self.gather is not None or t.is_dynamic_dim(1) or t.shape[1] % VECTOR:
            return "scalar"
        return "async" if self.k_major else "vector"


Staged = tuple[Value, Value, Value]  # (value, k, i) for shared[stage, k, i]


def _issue(op: Operand, tiling: Tiling, k0: Value, t: Value, shared: Value, stage: Value
           ) -> tuple[list[Value], list[Staged]]:
    """This thread's share of the operand's K step at ``k0``: async copies into ``shared[stage]``
    (their tokens) or values in registers for ``_store``."""
    threads = THREADS[0] * THREADS[1]
    per = tiling.per_thread(op.tile)
    tokens: list[Value] = []
    staged: list[Staged] = []
    if op.path == "scalar":
        read = op.gather.load if op.gather is not None else (lambda r, c: memref.load(op.source, [r, c]))
        for j in range(per):  # neighbouring threads on neighbouring elements
            e = arith.addi(t, _index(j * threads))
            if op.k_major:
                k, i = arith.divui(e, _index(op.tile)), arith.remui(e, _index(op.tile))
                value = _guarded_load(read, arith.addi(k0, k), arith.addi(op.base, i), op.k_size, op.extent)
            else:
                i, k = arith.divui(e, _index(tiling.bk)), arith.remui(e, _index(tiling.bk))
                value = _guarded_load(read, arith.addi(op.base, i), arith.addi(k0, k), op.extent, op.k_size)
            staged.append((value, k, i))
        return tokens, staged
    for v in range(per // VECTOR):
        e = arith.muli(arith.addi(t, _index(v * threads)), _index(VECTOR))
        if op.path == "async":  # source[k0 + k, base + i : +4] -> shared[stage, k, i : +4]
            k, i = arith.divui(e, _index(op.tile)), arith.remui(e, _index(op.tile))
            row, col = arith.addi(k0, k), arith.addi(op.base, i)
            inside = arith.andi(_ult(row, op.k_size), _ult(col, op.extent))
            zero = _index(0)
            tokens.append(nvgpu.device_async_copy(
                shared, [stage, k, i], op.source, [arith.select(inside, row, zero), arith.select(inside, col, zero)],
                IntegerAttr.get(IndexType.get(), VECTOR), src_elements=arith.select(inside, _index(VECTOR), zero),
                bypass_l1=UnitAttr.get()))
        else:  # source[base + i, k0 + k : +4] -> shared[stage, k : k + 4, i]
            i, k = arith.divui(e, _index(tiling.bk)), arith.remui(e, _index(tiling.bk))
            value = _guarded_vector_load(op.source, arith.addi(op.base, i), arith.addi(k0, k), op.extent, op.k_size)
            staged += [(vector.extract(value, [], [q]), arith.addi(k, _index(q)), i) for q in range(VECTOR)]
    return tokens, staged


def _store(staged: list[Staged], shared: Value, stage: Value) -> None:
    for value, k, i in staged:
        memref.store(value, shared, [stage, k, i])


def _apply_epilogue(op: Operation, m: Value, n: Value, acc: Value) -> Value:
    """Clone the epilogue's body at the insertion point for element (m, n) with ``out`` = ``acc``."""
    block = op.regions[0].blocks[0]
    args = list(block.arguments)
    n_in = len(args) - 1
    mapping: dict[Value, Value] = {args[-1]: acc}
    for arg, operand, attr in zip(args[:n_in], list(op.operands)[:n_in], ArrayAttr(op.attributes["indexing_maps"])):
        if isinstance(operand.type, MemRefType):
            mapping[arg] = memref.load(operand, [(m, n)[d] for d in _dims(attr)])
        else:
            mapping[arg] = operand
    return clone_body(block, mapping)


def _thread_offset(thread: Value, e: int, per: int, tile: int) -> Value:
    """Where element ``e`` of a thread's ``per`` rows (or columns) of the ``tile`` lies: groups of 4
    consecutive ones, group g at ``g * tile / (per / 4)``, so the threads of a warp read each
    group's 128-bit vectors from consecutive addresses (no bank conflicts)."""
    span = tile // (per // VECTOR)
    return arith.addi(arith.muli(thread, _index(VECTOR)), _index(e // VECTOR * span + e % VECTOR))


def _thread_vector(shared: Value, at: list[Value], thread: Value, per: int, tile: int) -> list[Value]:
    """The thread's ``per`` values of row ``at`` of a shared tile, one 128-bit load per group of 4."""
    vtype = VectorType.get([VECTOR], F32Type.get())
    out = []
    for g in range(per // VECTOR):
        v = vector.load(vtype, shared, at + [_thread_offset(thread, g * VECTOR, per, tile)], alignment=4 * VECTOR)
        out += [vector.extract(v, [], [q]) for q in range(VECTOR)]
    return out


def _thread_loop() -> tuple[Value, Value, InsertionPoint]:
    mapping = ArrayAttr.get([Attribute.parse("#gpu.thread<y>"), Attribute.parse("#gpu.thread<x>")])
    loop = scf.ForallOp([0, 0], list(THREADS), [1, 1], mapping=mapping)
    with InsertionPoint(loop.body):
        scf.InParallelOp()
    ty, tx = loop.body.arguments
    return ty, tx, InsertionPoint.at_block_terminator(loop.body)


def _kernel(p: Product, tiling: Tiling, name: str, rows: Value, cols: Value, k_size: Value,
            chosen: Value | None) -> None:
    """Insert the block and thread loops of one kernel computing ``p`` with ``tiling``
    (an empty grid unless ``chosen``, when given, holds)."""
    f32 = F32Type.get()
    space = Attribute.parse("#gpu.address_space<workgroup>")
    zero, one = _index(0), _index(1)
    grid = [arith.ceildivui(rows, _index(tiling.bm)), arith.ceildivui(cols, _index(tiling.bn))]
    if chosen is not None:
        grid[0] = arith.select(chosen, grid[0], zero)
    loop = scf.ParallelOp([], [zero, zero], grid, [one, one], [])
    loop.operation.attributes[MATMUL] = IntegerAttr.get(IntegerType.get_signless(64), 1)
    loop.operation.attributes[NODE] = StringAttr.get(name)
    body = loop.regions[0].blocks.append(IndexType.get(), IndexType.get())
    with InsertionPoint(body):
        end = scf.ReduceOp([], 0)
    with InsertionPoint(end.operation):
        bm, bn = body.arguments
        a_tile = memref.alloc(MemRefType.get([2, tiling.bk, tiling.bm + PAD], f32, memory_space=space), [], [])
        b_tile = memref.alloc(MemRefType.get([2, tiling.bk, tiling.bn + PAD], f32, memory_space=space), [], [])
        ty, tx, ip = _thread_loop()
        with ip:
            t = arith.addi(arith.muli(ty, _index(THREADS[1])), tx)
            a = Operand(p.a, p.a_k_major, arith.muli(bm, _index(tiling.bm)), rows, k_size, tiling.bm, p.a_gather)
            b = Operand(p.b, not p.b_n_major, arith.muli(bn, _index(tiling.bn)), cols, k_size, tiling.bn, p.b_gather)

            def issue(k0: Value, stage: Value) -> tuple[Value | None, list[Staged], list[Staged]]:
                """Start the K step at ``k0`` into ``stage``: async copies in flight, the rest in registers."""
                tokens_a, staged_a = _issue(a, tiling, k0, t, a_tile, stage)
                tokens_b, staged_b = _issue(b, tiling, k0, t, b_tile, stage)
                tokens = tokens_a + tokens_b
                return (nvgpu.device_async_create_group(tokens) if tokens else None), staged_a, staged_b

            def land(group: Value | None, staged_a: list[Staged], staged_b: list[Staged], stage: Value) -> None:
                """Finish it: store the staged values, wait for this thread's copies, one barrier."""
                _store(staged_a, a_tile, stage)
                _store(staged_b, b_tile, stage)
                if group is not None:
                    nvgpu.device_async_wait(group)
                gpu_dialect.barrier()

            land(*issue(zero, zero), zero)
            init = p.fill.operands[0]
            tm, tn = tiling.tm, tiling.tn
            k_loop = scf.ForOp(zero, k_size, _index(tiling.bk), [init] * (tm * tn))
            with InsertionPoint(k_loop.body):
                k0 = k_loop.induction_variable
                stage = arith.remui(arith.divui(k0, _index(tiling.bk)), _index(2))
                other = arith.subi(one, stage)
                upcoming = issue(arith.addi(k0, _index(tiling.bk)), other)  # the next step (zero past K)
                inner = scf.ForOp(zero, _index(tiling.bk), one, list(k_loop.inner_iter_args))
                with InsertionPoint(inner.body):
                    kk = inner.induction_variable
                    a_vals = _thread_vector(a_tile, [stage, kk], ty, tm, tiling.bm)
                    b_vals = _thread_vector(b_tile, [stage, kk], tx, tn, tiling.bn)
                    accs = list(inner.inner_iter_args)
                    scf.YieldOp([arith.addf(accs[i * tn + j], arith.mulf(a_vals[i], b_vals[j]))
                                 for i in range(tm) for j in range(tn)])
                land(*upcoming, other)  # after the product, into the other buffer
                scf.YieldOp(list(inner.results))
            for i in range(tm):
                m = arith.addi(a.base, _thread_offset(ty, i, tm, tiling.bm))
                for j in range(tn):
                    n = arith.addi(b.base, _thread_offset(tx, j, tn, tiling.bn))
                    branch = scf.IfOp(arith.andi(_ult(m, rows), _ult(n, cols)))
                    with InsertionPoint(branch.then_block):
                        acc = k_loop.results[i * tn + j]
                        value = _apply_epilogue(p.epilogue, m, n, acc) if p.epilogue else acc
                        if p.scatter is not None:
                            p.scatter.store(value, m, n)
                        else:
                            memref.store(value, p.c, [m, n])
                        scf.YieldOp([])
        memref.dealloc(a_tile)
        memref.dealloc(b_tile)


def rewrite(p: Product, name: str) -> None:
    """Replace ``p``'s ops by the kernel(s) of the module docstring, named ``<name>_tile<bm>``: one
    when C's shape is static, else a ``LARGE`` and a ``SMALL`` one of which the host launches the
    one ``tiling_for``'s rule picks."""
    with InsertionPoint(p.contraction), Location.unknown():
        rows, cols = _dim(p.c, 0), _dim(p.c, 1)
        k_axis = 0 if p.a_k_major else 1
        k_size = p.a_gather.size(k_axis) if p.a_gather else _dim(p.a, k_axis)
        c_type = MemRefType(p.c.type)
        if c_type.has_static_shape:
            tiling = tiling_for(*c_type.shape)
            _kernel(p, tiling, f"{name}_tile{tiling.bm}", rows, cols, k_size, None)
        else:
            blocks = arith.muli(arith.ceildivui(rows, _index(LARGE.bm)), arith.ceildivui(cols, _index(LARGE.bn)))
            large = arith.cmpi(arith.CmpIPredicate.uge, blocks, _index(SMS))
            _kernel(p, LARGE, f"{name}_tile{LARGE.bm}", rows, cols, k_size, large)
            small = arith.xori(large, arith.constant(IntegerType.get_signless(1), 1))
            _kernel(p, SMALL, f"{name}_tile{SMALL.bm}", rows, cols, k_size, small)
    for op in (p.epilogue, p.contraction, p.fill):
        if op is not None:
            op.erase()
    for gather in (p.a_gather, p.b_gather):
        if gather is not None:
            gather.erase()
    if p.scatter is not None:
        p.scatter.erase()


def register_tile(func: Operation, names: list[str]) -> int:
    """Rewrite every product of ``func`` (``names``: their Graph ops, in order, when known).

    The products are found again before each rewrite, on the block as the previous rewrites left
    it: a gather may read through another product's scatter (an unfused weight gradient gathers a
    ReLU gradient that reads the forward convolution's NCHW copy of its C), and that product's
    rewrite erases the copy and C; found afresh, the gather stops at the buffer the kernel wrote."""
    count = len(find_products(func))
    for i in range(count):
        products = find_products(func)
        if len(products) != count - i:
            raise RuntimeError(f"register tiling: {count - i} products left to rewrite, found {len(products)}")
        rewrite(products[0], names[i] if len(names) == count else "matmul")
    return count
