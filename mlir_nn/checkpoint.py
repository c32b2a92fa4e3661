"""``save`` / ``load``: state dicts to one ``.npz`` file, without pickle.

Arrays become entries of the archive; everything around them (nested dicts and lists,
numbers, strings, booleans, None) is one JSON entry that refers to the arrays by name.
Loading uses ``allow_pickle=False``: a file can hold data only, never code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

STRUCTURE = "__structure__"
FORMAT = "mlir-nn-checkpoint/1"


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"save: {where} is an array of {value.dtype}; only numeric arrays can be saved")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"array": name}
    if isinstance(value, np.generic):
        return _encode(value.item(), arrays, where)
    if isinstance(value, Mapping):
        return {"items": [[k, _encode(v, arrays, f"{where}[{k!r}]")] for k, v in value.items()
                          if _key(k, where)]}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"save: {where} is a {type(value).__name__}; a checkpoint holds dicts, lists, numbers, "
                    "strings and numeric arrays (no code)")


def _key(key: Any, where: str) -> bool:
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        raise TypeError(f"save: {where} has a key of type {type(key).__name__}; expected str or int keys")
    return True


def _decode(node: Any, arrays: Any) -> Any:
    if "array" in node:
        return arrays[node["array"]]
    if "items" in node:
        return {k: _decode(v, arrays) for k, v in node["items"]}
    if "list" in node:
        return [_decode(v, arrays) for v in node["list"]]
    return node["value"]


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` (a state dict, or anything with ``state_dict()``) to ``path`` (npz)."""
    if hasattr(obj, "state_dict"):
        obj = obj.state_dict()
    arrays: dict[str, np.ndarray] = {}
    structure = {"format": FORMAT, "root": _encode(obj, arrays, "obj")}
    text = np.frombuffer(json.dumps(structure).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays, **{STRUCTURE: text})


def load(path: str | os.PathLike) -> Any:
    """Read what ``save`` wrote: the same nested dicts, lists and numpy arrays."""
    with np.load(path, allow_pickle=False) as archive:
        if STRUCTURE not in archive.files:
            raise ValueError(f"load: {os.fspath(path)} is not an mlir-nn checkpoint (no {STRUCTURE} entry)")
        structure = json.loads(archive[STRUCTURE].tobytes().decode())
        if structure.get("format") != FORMAT:
            raise ValueError(f"load: {os.fspath(path)} has format {structure.get('format')!r}, expected {FORMAT!r}")
        arrays = {name: archive[name] for name in archive.files if name != STRUCTURE}
    return _decode(structure["root"], arrays)
