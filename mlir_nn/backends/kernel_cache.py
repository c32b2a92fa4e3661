"""A disk cache of compiled kernels, keyed by each kernel's own IR.

A split step's kernels (``kernel_split``) are named by their text, so the same product or
update in another step or another model is the same kernel. The compiled objects that
call no kernel of another object are stored under ``kernels/`` of the cache folder, named
by their sha256, with their LLVM-dialect text and the list of kernels they define: a cold
build's single object of the step and all its kernels (the step's symbols made local in the
cached copy), or, when some kernels came from here, the objects of the new kernels, which
then compile apart from the step (``cpu._build``). One index file per kernel, named by the
kernel's key (its text and ``salt``: the rest of the pipeline, the code generator's digest,
the LLVM opt level), names the object that holds it. A later build links objects that hold
the kernels it finds (``select``: no kernel defined twice) and compiles only the rest. Every
file is written under a temporary name and renamed into place; an index or object that is
missing, unreadable or fails its checksum is a miss (the kernel is compiled again and its
index replaced). Nothing is evicted, as in the step cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mlir_nn.support.disk_cache import TMP_PREFIX, cache_dir, sweep_stale

FOLDER = "kernels"
FORMAT = 1
MIN_SHARE = 0.5  # of an object's kernels that a step must need to link it


@dataclass(frozen=True)
class StoredObject:
    """A verified object file of the cache, the LLVM-dialect text it was compiled from and the
    kernels it defines."""

    path: Path
    text: str
    kernels: frozenset[str]


def folder() -> Path:
    return cache_dir() / FOLDER


def kernel_key(text: str, salt: str) -> str:
    """The key of a kernel: its text (at the split) and what else decides its machine code."""
    return hashlib.sha256(f"format={FORMAT}\0{salt}\0{text}".encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_object(root: Path, digest: str) -> StoredObject | None:
    try:
        meta = json.loads((root / f"{digest}.json").read_text())
        path = root / f"{digest}.o"
        text = (root / f"{digest}.mlir").read_text()
        if _sha256(path.read_bytes()) != digest or _sha256(text.encode()) != meta["text"]:
            return None
        return StoredObject(path, text, frozenset(map(str, meta["kernels"])))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def lookup(keys: Mapping[str, str]) -> dict[str, StoredObject]:
    """The cached object of each kernel (name -> key in ``keys``) that has one that checks out."""
    root = folder()
    found: dict[str, StoredObject] = {}
    verified: dict[str, StoredObject | None] = {}  # several kernels share an object: check it once
    for name, key in keys.items():
        try:
            digest = str(json.loads((root / key).read_text())["object"])
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if digest not in verified:
            verified[digest] = _read_object(root, digest)
        stored = verified[digest]
        if stored is not None and name in stored.kernels:
            found[name] = stored
    return found


def select(needed: Iterable[str], found: Mapping[str, StoredObject]) -> tuple[list[StoredObject], list[str]]:
    """The cached objects to link for the ``needed`` kernels and the kernels to compile. No
    kernel may be defined twice (the linker refuses it): objects that hold the most needed
    kernels are taken first, one that holds a kernel of an object taken already is not; nor
    is one of which the step needs less than ``MIN_SHARE`` of the kernels (the rest would be
    dead code in its shared object)."""
    needed = list(needed)
    wanted = set(needed)
    candidates = sorted({id(s): s for s in found.values()}.values(),
                        key=lambda s: (-len(s.kernels & wanted), s.path.name))
    chosen: list[StoredObject] = []
    covered: set[str] = set()
    for stored in candidates:
        share = len(stored.kernels & wanted) / len(stored.kernels) if stored.kernels else 0.0
        if share >= MIN_SHARE and not stored.kernels & covered:
            chosen.append(stored)
            covered |= stored.kernels
    return chosen, [name for name in needed if name not in covered]


def _write(path: Path, data: bytes) -> None:
    """``data`` into ``path``, atomically: a reader sees the old file or the whole new one."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=TMP_PREFIX, delete=False) as tmp:
        tmp.write(data)
    try:
        os.replace(tmp.name, path)
    except OSError:
        Path(tmp.name).unlink(missing_ok=True)
        raise


def store(object_path: Path, text: str, kernels: Mapping[str, str]) -> None:
    """Keep the object at ``object_path``, compiled from ``text``, for the kernels it defines
    (name -> key)."""
    root = folder()
    root.mkdir(mode=0o700, exist_ok=True)
    sweep_stale(root)
    data = object_path.read_bytes()
    digest = _sha256(data)
    encoded = text.encode()
    _write(root / f"{digest}.o", data)
    _write(root / f"{digest}.mlir", encoded)
    _write(root / f"{digest}.json", json.dumps({"text": _sha256(encoded), "kernels": sorted(kernels)}).encode())
    index = json.dumps({"object": digest}).encode()
    for key in kernels.values():
        _write(root / key, index)
