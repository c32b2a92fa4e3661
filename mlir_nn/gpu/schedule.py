"""Which transform schedule each linalg op gets, written as one transform script.

Every linalg op (after bufferization) is tagged with ``mlirnn.op = i`` and tiled:

* fused groups (a block loop made on tensors by ``mlir_nn.gpu.fusion``, holding a fill,
  a contraction and maybe an epilogue) keep their block loop; inside it the fill and
  epilogue are spread over the threads (``@mlirnn_block_elementwise``) and the
  contraction is staged through shared memory (``@mlirnn_block_contraction``);
* other contractions (``C[m, n] += A * B``, 2 parallel + 1 reduction loop, a multiply-add
  body) include ``@mlirnn_contraction`` from ``passes/cuda_schedule.mlir``;
* ops with parallel loops are tiled over them (the innermost parallel loop across
  ``thread<x>`` so neighbouring threads touch neighbouring elements); reduction loops
  stay whole inside each thread;
* sums over the batch into few outputs (the loss, small bias gradients) were already
  rewritten by ``mlir_nn.gpu.reduction`` into two kernels' loops (kind "reduction");
* other ops with no parallel loop (a 0-d epilogue) are left for
  ``fixups.wrap_sequential_ops``: one thread runs them.

Block-level loops become ``scf.parallel`` (a dynamic batch size then maps to the grid);
``thread_mapping_script`` then maps each launch's thread loops with its block size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from mlir.ir import ArrayAttr, Block, IntegerAttr, IntegerType, Module, Operation, StringAttr, Value

from mlir_nn.support.pipelines import shipped_dir

TAG = "mlirnn.op"
LAUNCH_TAG = "mlirnn.launch"
FUSED = "mlirnn.fused"  # on a tile loop made by mlir_nn.gpu.fusion: how many linalg ops it holds
REDUCE = "mlirnn.reduce"  # on a block loop made by mlir_nn.gpu.reduction: its kernel (1 or 2)
STAGE_NAMES = {1: "_partial", 2: "_total"}  # a reduction's kernels
TILING_SUFFIX = r"_tile\d+"  # a register-tiled product's kernel per tiling (named by mlir_nn.gpu.matmul)
TILING = re.compile(TILING_SUFFIX + "$")
KERNEL_SUFFIX = re.compile("(" + "|".join([*STAGE_NAMES.values(), TILING_SUFFIX]) + ")$")  # past the node's op
MATMUL = "mlirnn.matmul"  # on the block loop of a register-tiled product made by mlir_nn.gpu.matmul
NODE = "mlirnn.node"  # on a linalg op: the op of the Graph node it lowers (names the kernel)
TILE = 16  # output tile of a contraction per block (rows, columns), as in passes/cuda_schedule.mlir
THREADS_1D = 256
THREADS_2D = (8, 32)  # (y, x)
SCHEDULE_FILE = shipped_dir() / "cuda_schedule.mlir"


@dataclass(frozen=True)
class OpSchedule:
    tag: int
    kind: str  # "fused", "contraction", "parallel", "reduction" or "sequential"
    block_tiles: tuple[int, ...]  # per loop, 0 = not tiled
    thread_mapping: tuple[str, ...]  # per tiled loop, e.g. ("thread<y>", "thread<x>")
    block: tuple[int, int, int]
    fused_ops: int = 0  # kind "fused": linalg ops in the tile loop (fill, contraction[, epilogue])
    name: str = ""  # the Graph op it computes ("linear", "mse", ...), or its kind when unknown


def name_ops_by_location(module: Module) -> None:
    """Give every linalg op emitted under a name location ``op[shape]`` the attribute ``NODE = op``."""
    for top in module.body.operations:
        for op in _nested(top.operation):
            loc = op.location
            if op.name.startswith("linalg.") and op.name != "linalg.yield" and loc.is_a_name():
                op.attributes[NODE] = StringAttr.get(loc.name_str.split("[")[0])


def node_name(ops: list[Operation], default: str) -> str:
    """The last ``NODE`` attribute among ``ops`` (a fused epilogue names its group), else ``default``."""
    names = [StringAttr(o.attributes[NODE]).value for o in ops if NODE in o.attributes]
    return names[-1] if names else default


def iterator_kinds(op: Operation) -> list[str]:
    """'parallel' / 'reduction' per loop of a linalg.generic."""
    return [str(a).split("<")[-1].rstrip(">") for a in ArrayAttr(op.attributes["iterator_types"])]


def is_contraction(op: Operation, kinds: list[str]) -> bool:
    if kinds != ["parallel", "parallel", "reduction"] or len(op.operands) != 3:
        return False
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    return body in (["arith.mulf", "arith.addf", "linalg.yield"],)


def plan_op(op: Operation, tag: int) -> OpSchedule:
    kinds = iterator_kinds(op)
    parallel = [i for i, k in enumerate(kinds) if k == "parallel"]
    if is_contraction(op, kinds):
        return OpSchedule(tag, "contraction", (16, 16, 0), ("thread<y>", "thread<x>"), (16, 16, 1))
    if not parallel:
        return OpSchedule(tag, "sequential", (), (), (1, 1, 1))
    tiles = [0] * len(kinds)
    if len(parallel) == 1:
        tiles[parallel[0]] = THREADS_1D
        return OpSchedule(tag, "parallel", tuple(tiles), ("thread<x>",), (THREADS_1D, 1, 1))
    for d in parallel[:-2]:
        tiles[d] = 1  # outer parallel loops: one block per index
    tiles[parallel[-2]], tiles[parallel[-1]] = THREADS_2D
    mapping = ("thread<y>", "thread<x>")
    return OpSchedule(tag, "parallel", tuple(tiles), mapping, (THREADS_2D[1], THREADS_2D[0], 1))


def _fused_ops(loop: Operation) -> list[Operation]:
    ops = [o.operation for o in loop.regions[0].blocks[0].operations if o.operation.name.startswith("linalg.")]
    if len(ops) != IntegerAttr(loop.attributes[FUSED]).value or any(o.name != "linalg.generic" for o in ops):
        raise NotImplementedError(f"cuda: a fused tile loop holds {[o.name for o in ops]}; expected "
                                  f"{IntegerAttr(loop.attributes[FUSED]).value} linalg.generic ops")
    return ops


def tag_linalg_ops(func: Operation) -> list[OpSchedule]:
    """Tag the top-level linalg ops and fused loops of ``func`` and choose a schedule for each."""
    plans = []
    i64 = IntegerType.get_signless(64)
    for op in func.regions[0].blocks[0].operations:
        op = op.operation
        tag = len(plans)
        if op.name == "linalg.generic":
            op.attributes[TAG] = IntegerAttr.get(i64, tag)
            plan = plan_op(op, tag)
            plans.append(replace(plan, name=node_name([op], plan.kind)))
        elif op.name == "scf.forall" and FUSED in op.attributes:
            inner = _fused_ops(op)
            name = node_name([op], "matmul")
            del op.attributes["mapping"]  # #gpu.block kept canonicalize from folding it; the grid is mapped later
            for o in [op, *inner]:
                o.attributes[TAG] = IntegerAttr.get(i64, tag)
            plans.append(OpSchedule(tag, "fused", (), ("thread<y>", "thread<x>"), (TILE, TILE, 1), len(inner), name))
        elif op.name == "scf.parallel" and MATMUL in op.attributes:
            for o in [op, *(o for o in _nested(op) if o.name == "scf.forall")]:
                o.attributes[TAG] = IntegerAttr.get(i64, tag)
            plans.append(OpSchedule(tag, "matmul", (), ("thread<y>", "thread<x>"), (16, 16, 1),
                                    name=node_name([op], "matmul")))
        elif op.name == "scf.parallel" and REDUCE in op.attributes:
            for o in [op, *(o for o in _nested(op) if o.name == "scf.forall")]:
                o.attributes[TAG] = IntegerAttr.get(i64, tag)
            stage = STAGE_NAMES[IntegerAttr(op.attributes[REDUCE]).value]
            plans.append(OpSchedule(tag, "reduction", (), ("thread<x>",), (THREADS_1D, 1, 1),
                                    name=node_name([op], "sum") + stage))
        elif op.name.startswith("linalg."):
            raise NotImplementedError(f"cuda: {op.name} was not generalized; cannot schedule it")
    return _name_initializers(plans)


def _name_initializers(plans: list[OpSchedule]) -> list[OpSchedule]:
    """An op with no ``NODE`` (a fill that generalization rebuilt) is the initializer of the next named op."""
    out = list(plans)
    following = ""
    for i in reversed(range(len(out))):
        if out[i].kind == "parallel" and out[i].name == out[i].kind and following:
            out[i] = replace(out[i], name=f"{following}_init")
        elif out[i].name != out[i].kind:
            following = KERNEL_SUFFIX.sub("", out[i].name)  # the node, not its kernel
    return out


def _nested(op: Operation) -> list[Operation]:
    """Every op nested in ``op``, pre-order."""
    out = []
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                out += [child.operation, *_nested(child.operation)]
    return out


def _match(handle: str, attr: str, value: int, op: str | None = None) -> str:
    ops = f'ops{{["{op}"]}} ' if op else ""
    return (f"    {handle} = transform.structured.match {ops}attributes{{{attr} = {value} : i64}} in %root"
            " : (!transform.any_op) -> !transform.any_op\n")


def _parallel_tiling(p: OpSchedule) -> str:
    """Tile one op over its parallel loops: blocks (-> scf.parallel) then threads."""
    h = f"%op{p.tag}"
    sizes = ", ".join(map(str, p.block_tiles))
    mapped = [t for t in p.block_tiles if t > 1]
    threads = ", ".join(str(t if t > 1 else 0) for t in p.block_tiles)
    mapping = ", ".join(f"#gpu.{m}" for m in p.thread_mapping[-len(mapped):])
    return (
        f"    %t{p.tag}, %b{p.tag} = transform.structured.tile_using_forall {h} tile_sizes [{sizes}]"
        " : (!transform.any_op) -> (!transform.any_op, !transform.any_op)\n"
        f"    %tt{p.tag}, %th{p.tag} = transform.structured.tile_using_forall %t{p.tag} num_threads [{threads}]"
        f" (mapping = [{mapping}]) : (!transform.any_op) -> (!transform.any_op, !transform.any_op)\n"
        f"    %g{p.tag} = transform.loop.forall_to_parallel %b{p.tag} : (!transform.any_op) -> !transform.any_op\n"
    )


def _fused_tiling(p: OpSchedule) -> str:
    """Fill and epilogue over the threads, the contraction through shared memory, blocks to the grid."""
    t, any_op = p.tag, "!transform.any_op"
    parts = [f"%fill{t}", f"%mm{t}", f"%epi{t}"][:p.fused_ops]
    script = (
        f"    %ops{t} = transform.structured.match ops{{[\"linalg.generic\"]}} in %op{t} : ({any_op}) -> {any_op}\n"
        f"    {', '.join(parts)} = transform.split_handle %ops{t}"
        f" : ({any_op}) -> ({', '.join([any_op] * len(parts))})\n"
        f"    transform.include @mlirnn_block_elementwise failures(propagate) (%fill{t}) : ({any_op}) -> ()\n"
        f"    transform.include @mlirnn_block_contraction failures(propagate) (%op{t}, %mm{t})"
        f" : ({any_op}, {any_op}) -> ()\n"
    )
    if p.fused_ops == 3:
        script += f"    transform.include @mlirnn_block_elementwise failures(propagate) (%epi{t}) : ({any_op}) -> ()\n"
    return script + f"    %g{t} = transform.loop.forall_to_parallel %op{t} : ({any_op}) -> {any_op}\n"


def tiling_script(plans: list[OpSchedule]) -> str:
    """The transform module tiling every scheduled op (entry ``@mlirnn_tile``)."""
    body = ""
    for p in plans:
        if p.kind in ("sequential", "reduction", "matmul"):
            continue
        body += _match(f"%op{p.tag}", TAG, p.tag, "scf.forall" if p.kind == "fused" else None)
        if p.kind == "fused":
            body += _fused_tiling(p)
        elif p.kind == "contraction":
            body += (f"    transform.include @mlirnn_contraction failures(propagate) (%op{p.tag})"
                     " : (!transform.any_op) -> ()\n")
        else:
            body += _parallel_tiling(p)
    return _module(SCHEDULE_FILE.read_text() + (
        "transform.named_sequence @mlirnn_tile(%root: !transform.any_op {transform.readonly}) {\n"
        + body + "    transform.yield\n}\n"))


def thread_mapping_script(blocks: list[tuple[int, int, int]]) -> str:
    """Map the thread loops inside launch ``i`` (tagged ``mlirnn.launch = i``) to ``blocks[i]``."""
    body = ""
    for i, (x, y, z) in enumerate(blocks):
        body += _match(f"%l{i}", LAUNCH_TAG, i)
        body += (f"    %m{i} = transform.gpu.map_nested_forall_to_threads %l{i} block_dims = [{x}, {y}, {z}]"
                 " : (!transform.any_op) -> !transform.any_op\n")
    return _module("transform.named_sequence @mlirnn_threads(%root: !transform.any_op {transform.readonly}) {\n"
                   + body + "    transform.yield\n}\n")


def _module(sequences: str) -> str:
    return "module attributes {transform.with_named_sequence} {\n" + sequences + "}\n"


def clone_body(block: Block, mapping: dict[Value, Value]) -> Value:
    """Clone ``block``'s ops but its terminator at the insertion point, its arguments
    replaced through ``mapping``; returns the value the terminator yields."""
    ops = [o.operation for o in block.operations]
    for op in ops[:-1]:
        new = op.clone()
        for i, v in enumerate(new.operands):
            if v in mapping:
                new.operands[i] = mapping[v]
        for old, fresh in zip(op.results, new.results):
            mapping[old] = fresh
    result = ops[-1].operands[0]
    return mapping.get(result, result)
