"""Evaluate a launch plan for concrete argument shapes, in plain Python.

A plan (written by ``mlir_nn.gpu.plan``) is the host function of the compiled step as a
list of records: scalar arithmetic on sizes, buffer allocations and views, copies and
kernel launches. ``bind`` runs that program for the shapes of one call and returns the
buffers to allocate and the launches with their packed kernel parameters, in order.
Device pointers are filled in by the runtime (a parameter names its buffer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

ITEMSIZE = {"float32": 4, "float64": 8}
SCALAR_PARAM = {"index": "i64", "i64": "i64", "i32": "i32", "f32": "f32", "f64": "f64"}
FLOAT_TYPES = {"f32": np.float32, "f64": np.float64}
CMPI = {
    0: lambda a, b: a == b, 1: lambda a, b: a != b, 2: lambda a, b: a < b, 3: lambda a, b: a <= b,
    4: lambda a, b: a > b, 5: lambda a, b: a >= b, 6: lambda a, b: a < b, 7: lambda a, b: a <= b,
    8: lambda a, b: a > b, 9: lambda a, b: a >= b,
}


class PlanError(RuntimeError):
    """The plan cannot be evaluated for these shapes (or is malformed)."""


@dataclass(frozen=True)
class View:
    """A dense, row-major memref value: a buffer seen with a shape from an element offset."""

    buffer: str
    shape: tuple[int, ...]
    dtype: str
    offset: int = 0

    @property
    def strides(self) -> tuple[int, ...]:
        out, step = [], 1
        for d in reversed(self.shape):
            out.append(step)
            step *= d
        return tuple(reversed(out))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * ITEMSIZE[self.dtype]


Param = tuple[str, Any]  # ("ptr", buffer id) | ("i64" | "i32", int) | ("f32" | "f64", float)


@dataclass(frozen=True)
class Launch:
    binary: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: tuple[Param, ...]


@dataclass(frozen=True)
class Copy:
    src: View
    dst: View


@dataclass(frozen=True)
class BoundPlan:
    """The plan for one set of argument shapes."""

    allocs: dict[str, int]  # buffer id -> bytes
    actions: tuple[Launch | Copy, ...]
    args: tuple[View, ...]
    results: tuple[View, ...]


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _scalar(op: str, o: list[Any], rec: dict[str, Any]) -> Any:
    if op == "arith.constant":
        return rec["value"]
    if op == "arith.addi":
        return o[0] + o[1]
    if op == "arith.subi":
        return o[0] - o[1]
    if op == "arith.muli":
        return o[0] * o[1]
    if op in ("arith.divsi", "arith.divui"):
        return _tdiv(o[0], o[1])
    if op in ("arith.ceildivsi", "arith.ceildivui"):
        return -((-o[0]) // o[1])
    if op == "arith.floordivsi":
        return o[0] // o[1]
    if op in ("arith.remsi", "arith.remui"):
        return o[0] - _tdiv(o[0], o[1]) * o[1]
    if op in ("arith.minsi", "arith.minui"):
        return min(o)
    if op in ("arith.maxsi", "arith.maxui"):
        return max(o)
    if op == "arith.cmpi":
        return CMPI[rec["predicate"]](o[0], o[1])
    if op == "arith.select":
        return o[1] if o[0] else o[2]
    if op in ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci"):
        return int(o[0])
    if op in ("arith.sitofp", "arith.uitofp", "arith.extf", "arith.truncf"):
        return FLOAT_TYPES[rec["type"]](o[0])
    if op in ("arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.negf"):
        a = [FLOAT_TYPES[rec["type"]](x) for x in o]
        return {"arith.addf": lambda: a[0] + a[1], "arith.subf": lambda: a[0] - a[1],
                "arith.mulf": lambda: a[0] * a[1], "arith.divf": lambda: a[0] / a[1],
                "arith.negf": lambda: -a[0]}[op]()
    raise PlanError(f"plan op {op} is not supported by this runtime")


def _shape(rec: dict[str, Any], dynamic: list[int], numel: int | None = None) -> tuple[int, ...]:
    """Result shape of an alloc/view: static dims from the type, dynamic ones from operands or numel."""
    shape = list(rec["shape"])
    holes = [i for i, d in enumerate(shape) if d is None]
    if len(dynamic) == len(holes):
        for i, v in zip(holes, dynamic):
            shape[i] = int(v)
    elif numel is not None and len(holes) == 1:
        known = int(np.prod([d for d in shape if d is not None], dtype=np.int64))
        shape[holes[0]] = numel // known if known else 0
    else:
        raise PlanError(f"{rec['op']} {rec.get('res')}: cannot size dynamic dims {holes}")
    return tuple(shape)


def _memref_params(v: View) -> list[Param]:
    """convert-gpu-to-nvvm's memref ABI: allocated ptr, aligned ptr, offset, sizes, strides."""
    return ([("ptr", v.buffer), ("ptr", v.buffer), ("i64", v.offset)]
            + [("i64", d) for d in v.shape] + [("i64", s) for s in v.strides])


def bind(plan: dict[str, Any], shapes: list[tuple[int, ...]]) -> BoundPlan:
    """Evaluate ``plan`` for arguments of ``shapes`` (one per function argument)."""
    if len(shapes) != len(plan["args"]):
        raise PlanError(f"plan {plan['func']}: expected {len(plan['args'])} arguments, got {len(shapes)}")
    env: dict[str, Any] = {}
    args = []
    for a, shape in zip(plan["args"], shapes):
        want = a["shape"]
        if len(shape) != len(want) or any(w is not None and w != s for w, s in zip(want, shape)):
            raise PlanError(f"plan {plan['func']}: argument {a['id']} has shape {tuple(shape)}, expected {want}")
        env[a["id"]] = View(a["id"], tuple(int(d) for d in shape), a["dtype"])
        args.append(env[a["id"]])
    allocs: dict[str, int] = {}
    actions: list[Launch | Copy] = []
    for rec in plan["program"]:
        op = rec["op"]
        try:
            o = [env[v] for v in rec.get("operands", ())]
        except KeyError as e:
            raise PlanError(f"plan {plan['func']}: {op} reads {e} before it is defined") from None
        if op == "memref.dim":
            env[rec["res"]] = o[0].shape[o[1]]
        elif op == "memref.alloc":
            view = View(rec["res"], _shape(rec, o), rec["dtype"])
            allocs[rec["res"]] = view.nbytes
            env[rec["res"]] = view
        elif op in ("memref.expand_shape", "memref.collapse_shape", "memref.cast"):
            src = o[0]
            numel = int(np.prod(src.shape, dtype=np.int64))
            view = View(src.buffer, _shape(rec, o[1:], numel), src.dtype, src.offset)
            if view.nbytes != src.nbytes:
                raise PlanError(f"{op} {rec['res']}: view of {src.shape} as {view.shape} changes the size")
            env[rec["res"]] = view
        elif op == "memref.copy":
            if o[0].shape != o[1].shape:
                raise PlanError(f"memref.copy: shapes {o[0].shape} and {o[1].shape} differ")
            actions.append(Copy(o[0], o[1]))
        elif op == "gpu.launch_func":
            actions.append(_bind_launch(rec, env))
        else:
            env[rec["res"]] = _scalar(op, o, rec)
    results = tuple(env[r] for r in plan["results"])
    return BoundPlan(allocs, tuple(a for a in actions if not (isinstance(a, Launch) and 0 in a.grid)),
                     tuple(args), results)


def _bind_launch(rec: dict[str, Any], env: dict[str, Any]) -> Launch:
    params: list[Param] = []
    for a in rec["args"]:
        value = env[a["id"]]
        if a["kind"] == "memref":
            params += _memref_params(value)
        elif a["type"] in SCALAR_PARAM:
            kind = SCALAR_PARAM[a["type"]]
            params.append((kind, float(value) if kind in ("f32", "f64") else int(value)))
        else:
            raise PlanError(f"{rec['kernel']}: kernel argument of type {a['type']} is not supported")
    grid = tuple(int(env[g]) for g in rec["grid"])
    block = tuple(int(env[b]) for b in rec["block"])
    smem = int(env[rec["smem"]]) if rec["smem"] else 0
    return Launch(rec["binary"], rec["kernel"], grid, block, smem, tuple(params))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- PTX ABI check

PTX_PARAM = re.compile(r"\.param\s+\.(\w+)(\s+\.ptr)?")
PARAM_PTX_TYPES = {"ptr": ("u64",), "i64": ("u64", "s64", "b64"), "i32": ("u32", "s32", "b32"),
                   "f32": ("f32",), "f64": ("f64",)}


def ptx_entry_params(ptx: str, kernel: str) -> list[str]:
    """Types of the parameters of ``.entry kernel(...)`` in PTX text ('u64', 'f32', ...; '.ptr' marks pointers)."""
    m = re.search(r"\.entry\s+" + re.escape(kernel) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise PlanError(f"PTX has no entry {kernel}")
    return [t + (".ptr" if ptr else "") for t, ptr in PTX_PARAM.findall(m.group(1))]


def check_launch_abi(launch: Launch, ptx: str) -> None:
    """The packed parameters must match the kernel's PTX signature one by one."""
    declared = ptx_entry_params(ptx, launch.kernel)
    if len(declared) != len(launch.params):
        raise PlanError(f"{launch.binary}::{launch.kernel}: plan packs {len(launch.params)} parameters, "
                        f"PTX declares {len(declared)}")
    for i, ((kind, _), ptx_type) in enumerate(zip(launch.params, declared)):
        base = ptx_type.split(".")[0]
        if base not in PARAM_PTX_TYPES[kind] or (kind == "ptr") != ptx_type.endswith(".ptr"):
            raise PlanError(f"{launch.binary}::{launch.kernel}: parameter {i} is {kind} in the plan "
                            f"but .{ptx_type} in the PTX")
    m = re.search(r"\.entry\s+" + re.escape(launch.kernel) + r"\s*\(.*?\)\s*(.*?)\{", ptx, re.S)
    ntid = re.search(r"\.(?:maxntid|reqntid)\s+(\d+),\s*(\d+),\s*(\d+)", m.group(1)) if m else None
    if ntid and tuple(map(int, ntid.groups())) != launch.block:
        raise PlanError(f"{launch.binary}::{launch.kernel}: launched with block {launch.block}, "
                        f"kernel is built for {tuple(map(int, ntid.groups()))}")
