"""Read the launch plan out of the host function left after kernel outlining.

The host function holds only scalar arithmetic on sizes, buffer allocations and views,
copies and ``gpu.launch_func``. Each op becomes one JSON record of a small program that
``mlir_nn.runtime.plan`` evaluates for a concrete batch size, without MLIR.
"""

from __future__ import annotations

from typing import Any

from mlir.ir import AsmState, FloatAttr, IntegerAttr, MemRefType, Operation, Value

SCALAR_OPS = {
    "arith.addi", "arith.subi", "arith.muli", "arith.divsi", "arith.divui", "arith.ceildivsi",
    "arith.ceildivui", "arith.floordivsi", "arith.remsi", "arith.remui", "arith.minsi", "arith.maxsi",
    "arith.minui", "arith.maxui", "arith.cmpi", "arith.select", "arith.index_cast", "arith.index_castui",
    "arith.extsi", "arith.extui", "arith.trunci", "arith.sitofp", "arith.uitofp", "arith.addf",
    "arith.subf", "arith.mulf", "arith.divf", "arith.negf", "arith.extf", "arith.truncf",
}
VIEW_OPS = {"memref.expand_shape", "memref.collapse_shape", "memref.cast"}
ELEMENT_DTYPES = {"f32": "float32", "f64": "float64"}
LAUNCH_SEGMENTS = ("async", "gx", "gy", "gz", "bx", "by", "bz", "cx", "cy", "cz", "smem", "args", "async_object")


def memref_type(t: Any, what: str) -> dict[str, Any]:
    """{"shape": [int | None], "dtype": numpy name} of an identity-layout memref type."""
    mt = MemRefType(t)
    if str(mt.layout) != f"affine_map<({', '.join(f'd{i}' for i in range(mt.rank))}) -> "\
                         f"({', '.join(f'd{i}' for i in range(mt.rank))})>":
        raise NotImplementedError(f"cuda plan: {what} has a non-identity layout {mt}; only dense buffers are supported")
    elem = str(mt.element_type)
    if elem not in ELEMENT_DTYPES:
        raise NotImplementedError(f"cuda plan: {what} has element type {elem}; expected f32 or f64")
    return {"shape": [None if mt.is_dynamic_dim(i) else mt.shape[i] for i in range(mt.rank)],
            "dtype": ELEMENT_DTYPES[elem]}


def _constant(op: Operation) -> int | float:
    attr = op.attributes["value"]
    if isinstance(attr, IntegerAttr):
        return int(attr.value)
    if isinstance(attr, FloatAttr):
        return float(attr.value)
    raise NotImplementedError(f"cuda plan: host constant {op} is not a scalar")


def extract_plan(func: Operation) -> dict[str, Any]:
    """The plan of a bufferized, outlined host function (see module docstring)."""
    state = AsmState(func)

    def name(v: Value) -> str:
        return v.get_name(state)

    block = func.regions[0].blocks[0]
    args = [{"id": name(a), **memref_type(a.type, f"argument {i}")} for i, a in enumerate(block.arguments)]
    program: list[dict[str, Any]] = []
    results: list[str] = []
    for child in block.operations:
        op = child.operation
        kind = op.name
        rec: dict[str, Any] = {"op": kind, "operands": [name(v) for v in op.operands]}
        if op.results:
            rec["res"] = name(op.results[0])
            rec["type"] = str(op.results[0].type)
        if kind == "func.return":
            results = rec["operands"]
            continue
        if kind == "memref.dealloc":
            continue
        if kind == "arith.constant":
            rec["value"] = _constant(op)
        elif kind in ("arith.cmpi",):
            rec["predicate"] = IntegerAttr(op.attributes["predicate"]).value
        elif kind == "memref.dim":
            pass
        elif kind == "memref.alloc" or kind in VIEW_OPS:
            rec.update(memref_type(op.results[0].type, kind))
        elif kind == "memref.copy":
            pass
        elif kind == "gpu.launch_func":
            rec = _launch(op, name)
        elif kind not in SCALAR_OPS:
            raise NotImplementedError(f"cuda plan: host op {kind} is not supported by the runtime:\n{op}")
        program.append(rec)
    return {"func": func.attributes["sym_name"].value, "args": args, "program": program, "results": results}


def _launch(op: Operation, name: Any) -> dict[str, Any]:
    sizes = list(op.attributes["operandSegmentSizes"])
    operands = list(op.operands)
    groups, pos = {}, 0
    for seg, size in zip(LAUNCH_SEGMENTS, sizes):
        groups[seg] = operands[pos:pos + size]
        pos += size
    if groups["async"] or groups["cx"]:
        raise NotImplementedError(f"cuda plan: async or clustered launches are not supported:\n{op}")
    module, kernel = (part.strip().lstrip("@") for part in str(op.attributes["kernel"]).split("::"))
    args = []
    for v in groups["args"]:
        if isinstance(v.type, MemRefType):
            args.append({"id": name(v), "kind": "memref", "rank": MemRefType(v.type).rank})
        else:
            args.append({"id": name(v), "kind": "scalar", "type": str(v.type)})
    return {
        "op": "gpu.launch_func", "binary": module, "kernel": kernel,
        "grid": [name(groups[k][0]) for k in ("gx", "gy", "gz")],
        "block": [name(groups[k][0]) for k in ("bx", "by", "bz")],
        "smem": name(groups["smem"][0]) if groups["smem"] else None,
        "args": args,
    }
