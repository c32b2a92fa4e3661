"""Epilogue fusion on tensors: one GPU kernel per matmul with its fill and epilogue.

The shared codegen writes a fused node of the optimized Graph (``linear``, ``gemm``,
``matmul_relu_grad``) as three linalg ops: a ``linalg.fill`` of zeros, the
``linalg.matmul`` accumulating into it, and an element-wise ``linalg.generic`` that
reads the product and writes its result back into the product's tensor (``outs`` is
the product). A plain ``matmul`` node (or a contraction written as a generic) is the
first two.

``fuse_contractions`` finds these groups, rewrites each epilogue to read the product
through its ``outs`` argument (so the product has a single use, the destination), and
tiles the last op of the group to 16x16 output tiles with ``scf.forall``, fusing the
others into the tile loop (``transform.structured.fuse_into_containing_op``). Each
tile loop is annotated ``mlirnn.fused = <number of ops>``; after bufferization the
schedule (``mlir_nn.gpu.schedule``) stages the matmul's operands in shared memory and
spreads the three ops over the block's threads, so all of it is one kernel and the
epilogue is applied to the tile the block has just accumulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir.ir import ArrayAttr, InsertionPoint, IntegerAttr, IntegerType, Operation, Value

from mlir_nn.codegen import linalg_ops as linalg
from mlir_nn.gpu.schedule import FUSED, NODE, TILE, is_contraction, iterator_kinds, node_name


@dataclass(frozen=True)
class Group:
    tag: int
    ops: int  # 2 (fill, matmul) or 3 (fill, matmul, epilogue)
    name: str  # the Graph op of the group ("linear", "gemm", ...; "matmul" when unnamed)
    dtype: str  # element type of the product ("f32", "f64")


def _producer(v: Value) -> Operation | None:
    owner = v.owner
    return owner if isinstance(owner, Operation) else getattr(owner, "operation", None)


def _users(v: Value) -> list[Operation]:
    """The distinct ops using ``v``."""
    users: list[Operation] = []
    for use in v.uses:
        if use.owner not in users:
            users.append(use.owner)
    return users


def _is_epilogue_of(op: Operation, product: Value) -> bool:
    """An all-parallel generic reading the product first (and nowhere else) and writing into it."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    kinds = [str(a) for a in ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in k for k in kinds):
        return False
    n_in = len(op.operands) - 1
    maps = ArrayAttr(op.attributes["indexing_maps"])
    at = [i for i, v in enumerate(op.operands) if v == product]
    return n_in >= 1 and at == [0, n_in] and str(maps[0]) == str(maps[n_in])


def epilogue_reads_accumulator(op: Operation) -> Operation:
    """Rewrite ``generic ins(P, xs...) outs(P)`` to ``generic ins(xs...) outs(P)`` reading P via ``outs``."""
    n_in = len(op.operands) - 1
    maps = ArrayAttr(op.attributes["indexing_maps"])
    with InsertionPoint(op), op.location:
        new = linalg.GenericOp([op.results[0].type], list(op.operands)[1:n_in], [op.operands[n_in]],
                               ArrayAttr.get(list(maps)[1:]), op.attributes["iterator_types"])
        block = new.regions[0].blocks.append(*[a.type for a in list(op.regions[0].blocks[0].arguments)[1:]])
    old_block = op.regions[0].blocks[0]
    args = list(old_block.arguments)
    args[0].replace_all_uses_with(block.arguments[-1])
    for old, fresh in zip(args[1:], block.arguments):
        old.replace_all_uses_with(fresh)
    for child in list(old_block.operations):
        block.append(child.operation)
    op.results[0].replace_all_uses_with(new.results[0])
    op.erase()
    return new.operation


def find_groups(func: Operation) -> list[list[Operation]]:
    """[fill, matmul] or [fill, matmul, epilogue] for every contraction of ``func`` into a fill."""
    groups = []
    for op in [o.operation for o in func.regions[0].blocks[0].operations]:
        if op.name != "linalg.matmul" and not (op.name == "linalg.generic" and is_contraction(op, iterator_kinds(op))):
            continue
        fill = _producer(op.operands[2])
        if fill is None or fill.name != "linalg.fill" or len(_users(fill.results[0])) != 1:
            continue
        product = op.results[0]
        users = _users(product)
        group = [fill, op]
        if len(users) == 1 and _is_epilogue_of(users[0], product):
            group.append(users[0])
        groups.append(group)
    return groups


ROLES = ("mlirnn.fill", "mlirnn.matmul", "mlirnn.epilogue")  # attribute per op of a group, value = group


def tag_groups(func: Operation) -> list[Group]:
    """Rewrite each group's epilogue and tag its ops with ``ROLES`` (see the module docstring)."""
    groups = []
    i64 = IntegerType.get_signless(64)
    for ops in find_groups(func):
        name = node_name(ops, "matmul")
        if len(ops) == 3:
            ops[2] = epilogue_reads_accumulator(ops[2])
        tag = len(groups)
        for op, role in zip(ops, ROLES):
            op.attributes[role] = IntegerAttr.get(i64, tag)
        groups.append(Group(tag, len(ops), name, str(ops[1].results[0].type.element_type)))
    return groups


def fusion_script(groups: list[Group]) -> str:
    """Transform module (entry ``@mlirnn_fuse``): tile each group's last op to blocks, fuse the rest in."""
    body = ""
    for g in groups:
        t = g.tag
        handles = {role: f"%{role.split('.')[1]}{t}" for role in ROLES[:g.ops]}
        for role, handle in handles.items():
            body += (f"    {handle} = transform.structured.match attributes{{{role} = {t} : i64}} in %root"
                     " : (!transform.any_op) -> !transform.any_op\n")
        sizes = f"{TILE}, {TILE}" + (", 0" if g.ops == 2 else "")
        # The #gpu.block mapping keeps canonicalize from folding one-tile loops into the host.
        body += (f"    %tiled{t}, %loop{t}_0 = transform.structured.tile_using_forall {handles[ROLES[g.ops - 1]]}"
                 f" tile_sizes [{sizes}] (mapping = [#gpu.block<y>, #gpu.block<x>])"
                 " : (!transform.any_op) -> (!transform.any_op, !transform.any_op)\n")
        producers = [handles[r] for r in reversed(ROLES[:g.ops - 1])]
        for i, producer in enumerate(producers):
            body += (f"    %fused{t}_{i}, %loop{t}_{i + 1} = transform.structured.fuse_into_containing_op {producer}"
                     f" into %loop{t}_{i} : (!transform.any_op, !transform.any_op)"
                     " -> (!transform.any_op, !transform.any_op)\n")
        body += (f"    %n{t} = transform.param.constant {g.ops} : i64 -> !transform.param<i64>\n"
                 f"    transform.annotate %loop{t}_{len(producers)} \"{FUSED}\" = %n{t}"
                 " : !transform.any_op, !transform.param<i64>\n"
                 f"    %name{t} = transform.param.constant \"{g.name}\" -> !transform.any_param\n"
                 f"    transform.annotate %loop{t}_{len(producers)} \"{NODE}\" = %name{t}"
                 " : !transform.any_op, !transform.any_param\n")
    return ("module attributes {transform.with_named_sequence} {\n"
            "transform.named_sequence @mlirnn_fuse(%root: !transform.any_op {transform.readonly}) {\n"
            + body + "    transform.yield\n}\n}\n")
