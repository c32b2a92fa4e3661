"""IR rewrites between pipeline stages that no upstream pass does for us."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from mlir.dialects import arith, scf
from mlir.ir import IndexType, InsertionPoint, IntegerAttr, IntegerType, Location, MemRefType, Operation

from mlir_nn.gpu.schedule import LAUNCH_TAG, TAG, OpSchedule


def walk(op: Operation) -> Iterator[Operation]:
    """Every op nested in ``op`` (pre-order), not ``op`` itself."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from walk(child.operation)


def top_level(func: Operation) -> list[Operation]:
    return [o.operation for o in func.regions[0].blocks[0].operations]


def erase_self_copies(func: Operation) -> int:
    """Drop ``memref.copy %x, %x`` (left by bufferizing a tile loop that wrote its tile in place)."""
    copies = [o for o in walk(func) if o.name == "memref.copy" and o.operands[0] == o.operands[1]]
    for op in copies:
        op.erase()
    return len(copies)


def wrap_sequential_ops(func: Operation, plans: list[OpSchedule]) -> int:
    """Put each op without parallel loops in a one-iteration ``scf.parallel`` (one GPU thread)."""
    sequential = {p.tag for p in plans if p.kind == "sequential"}
    wrapped = 0
    for op in top_level(func):
        if TAG not in op.attributes or IntegerAttr(op.attributes[TAG]).value not in sequential:
            continue
        with InsertionPoint(op), Location.unknown():
            zero = arith.constant(IndexType.get(), 0)
            one = arith.constant(IndexType.get(), 1)
            loop = scf.ParallelOp([], [zero], [one], [one], [])
            body = loop.regions[0].blocks.append(IndexType.get())
        with InsertionPoint(body), Location.unknown():
            end = scf.ReduceOp([], 0)
        op.move_before(end.operation)
        wrapped += 1
    return wrapped


def check_all_launched(func: Operation, what: Callable[[Operation], bool]) -> None:
    """After mapping to the GPU, no compute may be left in the host function."""
    for op in top_level(func):
        if what(op):
            raise RuntimeError(f"cuda: {op.name} was not mapped to a GPU kernel:\n{op}")


def tag_launches(func: Operation, plans: list[OpSchedule]) -> list[tuple[tuple[int, int, int], str]]:
    """Tag each gpu.launch; return its block size and name (from the schedule of the op inside)."""
    by_tag = {p.tag: p for p in plans}
    launches: list[tuple[tuple[int, int, int], str]] = []
    for op in top_level(func):
        if op.name != "gpu.launch":
            continue
        tags = {IntegerAttr(o.attributes[TAG]).value for o in walk(op) if TAG in o.attributes}
        if len(tags) != 1:
            raise RuntimeError(f"cuda: a gpu.launch holds ops of schedules {sorted(tags)}; expected exactly one")
        op.attributes[LAUNCH_TAG] = IntegerAttr.get(IntegerType.get_signless(64), len(launches))
        plan = by_tag[tags.pop()]
        launches.append((plan.block, plan.name))
    return launches


def alloc_to_workgroup_attributions(func: Operation) -> int:
    """Move workgroup-space ``memref.alloc``s inside each gpu.launch to workgroup attributions.

    ``transform.structured.promote`` allocates the shared-memory tiles with
    ``memref.alloc`` inside the launch; convert-gpu-to-nvvm would lower those to device
    ``malloc`` (global memory). As attributions they become ``.shared`` arrays.
    """
    moved = 0
    for launch in [o for o in walk(func) if o.name == "gpu.launch"]:
        allocs = [o for o in walk(launch) if o.name == "memref.alloc" and _is_workgroup(o)]
        body = launch.regions[0].blocks[0]
        for alloc in allocs:
            for use in list(alloc.results[0].uses):
                if use.owner.name == "memref.dealloc":
                    use.owner.erase()
            arg = body.add_argument(alloc.results[0].type, Location.unknown())
            alloc.results[0].replace_all_uses_with(arg)
            alloc.erase()
            moved += 1
        if allocs:
            has = "workgroup_attributions" in launch.attributes
            count = IntegerAttr(launch.attributes["workgroup_attributions"]).value if has else 0
            launch.attributes["workgroup_attributions"] = IntegerAttr.get(
                IntegerType.get_signless(64), count + len(allocs))
    return moved


def _is_workgroup(alloc: Operation) -> bool:
    t = MemRefType(alloc.results[0].type)
    return t.memory_space is not None and "workgroup" in str(t.memory_space) and t.has_static_shape
