"""Register-tiled float32 products: one kernel per fill + contraction (+ epilogue), written as loops.

After bufferization a fused node of the optimized Graph (``linear``, ``gemm``,
``matmul_relu_grad``, ``matmul``) is three adjacent ``linalg.generic`` ops on one
output buffer C: a fill, the contraction ``C[m, n] += A * B`` (either operand may be
transposed) and maybe an element-wise epilogue that reads C through its ``outs``
argument (``mlir_nn.gpu.fusion.tag_groups`` rewrote it so). ``register_tile`` replaces
each such group by the loops of one kernel, in the form the rest of the pipeline maps to
the GPU (an ``scf.parallel`` block loop holding one ``scf.forall`` thread loop):

* a block computes a ``BM x BN`` tile of C with ``THREADS`` threads; each thread keeps a
  ``TM x TN`` tile of accumulators in registers (loop-carried values) across the whole K
  loop, starting from the fill value;
* A's ``BM x BK`` and B's ``BK x BN`` tiles are staged in shared memory (both stored
  K-major, zero outside the matrices), each thread loading ``BM * BK / threads`` elements;
  the shared buffers are doubled: while a K step computes from one, the next step's tiles
  are loaded into registers and stored into the other after the product, so each step
  needs one barrier and the global loads overlap the arithmetic;
* per k each thread reads a ``TM``-vector of A and a ``TN``-vector of B (two 128-bit
  shared loads) for ``TM * TN`` multiply-adds (``fma.rn.f32`` with ``fastmath<contract>``);
* the epilogue (bias, ReLU, the ReLU-gradient mask, ``W - lr * grad``) is applied to the
  accumulators in registers and each result stored once, inside the matrix bounds.

The SIMT interpreter (``mlir_nn.gpu.simt``) checks these kernels; the CPU emulation of
the schedule (``mlir_nn.gpu.emulate``) runs the 16x16 shared-memory schedule instead,
which float64 products still use.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir.dialects import arith, memref, scf, vector
from mlir.dialects import gpu as gpu_dialect
from mlir.ir import (
    AffineDimExpr,
    AffineMapAttr,
    ArrayAttr,
    Attribute,
    F32Type,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    MemRefType,
    Operation,
    StringAttr,
    Value,
    VectorType,
)

from mlir_nn.gpu.schedule import MATMUL, NODE, clone_body, is_contraction, iterator_kinds

BM, BN, BK = 64, 64, 16  # block tile of C and the K step
TM, TN = 4, 4  # accumulators per thread (rows, columns)
THREADS = (BM // TM, BN // TN)  # (y, x) = (16, 16)


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
    ops = [o.operation for o in func.regions[0].blocks[0].operations if o.operation.name.startswith("linalg.")]
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
        found.append(Product(ops[i - 1], op, epilogue, a, b, c, maps[0] == [2, 0], maps[1] == [1, 2]))
    return found


def _index(v: int) -> Value:
    return arith.constant(IndexType.get(), v)


def _dim(v: Value, axis: int) -> Value:
    t = MemRefType(v.type)
    return _index(t.shape[axis]) if not t.is_dynamic_dim(axis) else memref.dim(v, _index(axis))


def _guarded_load(source: Value, row: Value, col: Value, rows: Value, cols: Value) -> Value:
    """``source[row, col]`` inside the matrix, else 0."""
    f32 = F32Type.get()
    inside = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, row, rows), arith.cmpi(arith.CmpIPredicate.ult, col, cols))
    branch = scf.IfOp(inside, [f32], has_else=True)
    with InsertionPoint(branch.then_block):
        scf.YieldOp([memref.load(source, [row, col])])
    with InsertionPoint(branch.else_block):
        scf.YieldOp([arith.constant(f32, 0.0)])
    return branch.results[0]


def _fetch(source: Value, k_major: bool, k0: Value, base: Value, extent: Value, k_size: Value,
           t: Value) -> list[tuple[Value, Value, Value]]:
    """This thread's share of a 64 x BK tile of ``source`` (rows ``base..`` of ``extent``, columns ``k0..``;
    or its transpose when ``k_major``): (value, k, i) for ``shared[k][i]``, neighbours on neighbours."""
    threads = THREADS[0] * THREADS[1]
    out = []
    for i in range(BM * BK // threads):
        e = arith.addi(t, _index(i * threads))
        if k_major:  # source[k, i]: 64 consecutive i per row
            k, j = arith.divui(e, _index(BM)), arith.remui(e, _index(BM))
            value = _guarded_load(source, arith.addi(k0, k), arith.addi(base, j), k_size, extent)
        else:  # source[i, k]: BK consecutive k per row
            j, k = arith.divui(e, _index(BK)), arith.remui(e, _index(BK))
            value = _guarded_load(source, arith.addi(base, j), arith.addi(k0, k), extent, k_size)
        out.append((value, k, j))
    return out


def _store(fetched: list[tuple[Value, Value, Value]], shared: Value, stage: Value) -> None:
    for value, k, j in fetched:
        memref.store(value, shared, [stage, k, j])


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


def _thread_loop() -> tuple[Value, Value, InsertionPoint]:
    mapping = ArrayAttr.get([Attribute.parse("#gpu.thread<y>"), Attribute.parse("#gpu.thread<x>")])
    loop = scf.ForallOp([0, 0], list(THREADS), [1, 1], mapping=mapping)
    with InsertionPoint(loop.body):
        scf.InParallelOp()
    ty, tx = loop.body.arguments
    return ty, tx, InsertionPoint.at_block_terminator(loop.body)


def rewrite(p: Product, name: str) -> None:
    """Replace ``p``'s ops by the block and thread loops of the module docstring."""
    f32 = F32Type.get()
    space = Attribute.parse("#gpu.address_space<workgroup>")
    with InsertionPoint(p.contraction), Location.unknown():
        rows, cols = _dim(p.c, 0), _dim(p.c, 1)
        k_size = _dim(p.a, 0 if p.a_k_major else 1)
        zero, one = _index(0), _index(1)
        grid = [arith.ceildivui(rows, _index(BM)), arith.ceildivui(cols, _index(BN))]
        loop = scf.ParallelOp([], [zero, zero], grid, [one, one], [])
        loop.operation.attributes[MATMUL] = IntegerAttr.get(IntegerType.get_signless(64), 1)
        loop.operation.attributes[NODE] = StringAttr.get(name)
        body = loop.regions[0].blocks.append(IndexType.get(), IndexType.get())
        with InsertionPoint(body):
            end = scf.ReduceOp([], 0)
    with InsertionPoint(end.operation), Location.unknown():
        bm, bn = body.arguments
        a_tile = memref.alloc(MemRefType.get([2, BK, BM], f32, memory_space=space), [], [])
        b_tile = memref.alloc(MemRefType.get([2, BK, BN], f32, memory_space=space), [], [])
        ty, tx, ip = _thread_loop()
        with ip:
            t = arith.addi(arith.muli(ty, _index(THREADS[1])), tx)
            row0, col0 = arith.muli(bm, _index(BM)), arith.muli(bn, _index(BN))

            def fetch(k0: Value) -> list[tuple[Value, Value, Value]]:
                return (_fetch(p.a, p.a_k_major, k0, row0, rows, k_size, t)
                        + _fetch(p.b, not p.b_n_major, k0, col0, cols, k_size, t))

            def store(fetched: list[tuple[Value, Value, Value]], stage: Value) -> None:
                half = len(fetched) // 2
                _store(fetched[:half], a_tile, stage)
                _store(fetched[half:], b_tile, stage)

            store(fetch(_index(0)), _index(0))
            gpu_dialect.barrier()
            init = p.fill.operands[0]
            k_loop = scf.ForOp(_index(0), k_size, _index(BK), [init] * (TM * TN))
            with InsertionPoint(k_loop.body):
                k0 = k_loop.induction_variable
                stage = arith.remui(arith.divui(k0, _index(BK)), _index(2))
                upcoming = fetch(arith.addi(k0, _index(BK)))  # the next tiles, into registers (zero past K)
                inner = scf.ForOp(_index(0), _index(BK), _index(1), list(k_loop.inner_iter_args))
                with InsertionPoint(inner.body):
                    kk = inner.induction_variable
                    a = vector.load(VectorType.get([TM], f32), a_tile, [stage, kk, arith.muli(ty, _index(TM))],
                                    alignment=4 * TM)
                    b = vector.load(VectorType.get([TN], f32), b_tile, [stage, kk, arith.muli(tx, _index(TN))],
                                    alignment=4 * TN)
                    a_vals = [vector.extract(a, [], [i]) for i in range(TM)]
                    b_vals = [vector.extract(b, [], [j]) for j in range(TN)]
                    accs = list(inner.inner_iter_args)
                    scf.YieldOp([arith.addf(accs[i * TN + j], arith.mulf(a_vals[i], b_vals[j]))
                                 for i in range(TM) for j in range(TN)])
                store(upcoming, arith.subi(_index(1), stage))  # after the product, into the other buffer
                gpu_dialect.barrier()  # one barrier per K step
                scf.YieldOp(list(inner.results))
            for i in range(TM):
                m = arith.addi(row0, arith.addi(arith.muli(ty, _index(TM)), _index(i)))
                for j in range(TN):
                    n = arith.addi(col0, arith.addi(arith.muli(tx, _index(TN)), _index(j)))
                    inside = arith.andi(arith.cmpi(arith.CmpIPredicate.ult, m, rows),
                                        arith.cmpi(arith.CmpIPredicate.ult, n, cols))
                    branch = scf.IfOp(inside)
                    with InsertionPoint(branch.then_block):
                        acc = k_loop.results[i * TN + j]
                        value = _apply_epilogue(p.epilogue, m, n, acc) if p.epilogue else acc
                        memref.store(value, p.c, [m, n])
                        scf.YieldOp([])
        memref.dealloc(a_tile)
        memref.dealloc(b_tile)
    for op in (p.epilogue, p.contraction, p.fill):
        if op is not None:
            op.erase()


def register_tile(func: Operation, names: list[str]) -> int:
    """Rewrite every product of ``func`` (``names``: their Graph ops, in order, when known)."""
    products = find_products(func)
    for i, p in enumerate(products):
        rewrite(p, names[i] if len(names) == len(products) else "matmul")
    return len(products)
