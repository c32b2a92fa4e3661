"""The compile cache: in memory and on disk, keyed by what determines the machine code.

Key: sha256 of (graph fingerprint, pipeline text, target, package version, LLVM opt
level). On disk (``~/.cache/mlir-nn``, or ``$MLIR_NN_CACHE_DIR``) an entry is a folder
``<key>/`` holding ``step.so``, the MLIR stages as text and ``meta.json`` with the key,
the sha256 of the shared object and of every stage text. An entry whose metadata,
key or checksums do not match is treated as missing and rebuilt; it is never trusted.
Whatever sits where an entry goes (a file, a broken folder) is replaced. Staging folders
and ``.tmp-`` files that killed writers left behind are removed once they are an hour old.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlir_nn.support.disk_cache import STAGING_PREFIX, cache_dir, remove, sweep_stale

LIBRARY = "step.so"
META = "meta.json"
FORMAT = 2

def cache_key(fingerprint: str, pipeline_text: str, target: str, version: str, opt_level: int) -> str:
    parts = [f"format={FORMAT}", fingerprint, pipeline_text, target, version, f"O{opt_level}"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class DiskEntry:
    """A verified on-disk entry: the shared object, its metadata and stage texts."""

    folder: Path
    meta: dict[str, Any]
    stages: dict[str, str] = field(default_factory=dict)

    @property
    def library(self) -> Path:
        return self.folder / LIBRARY


def read_entry(key: str) -> DiskEntry | None:
    """The entry for ``key`` if it exists and checks out; None when missing or corrupt."""
    folder = cache_dir() / key
    try:
        meta = json.loads((folder / META).read_text())
        if meta.get("key") != key or meta.get("format") != FORMAT:
            return None
        if _sha256(folder / LIBRARY) != meta.get("sha256"):
            return None
        checksums = meta.get("stages", {})
        stages = {name: (folder / f"{name}.mlir").read_text() for name in checksums}
        if any(_text_sha256(text) != checksums[name] for name, text in stages.items()):
            return None
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return DiskEntry(folder, meta, stages)


def write_entry(key: str, library: Path, meta: dict[str, Any], stages: dict[str, str]) -> DiskEntry:
    """Store ``library`` (moved) with metadata and stage texts; replaces any old entry atomically."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    sweep_stale(root)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{key[:16]}-", dir=root))
    try:
        shutil.move(str(library), staging / LIBRARY)
        for name, text in stages.items():
            (staging / f"{name}.mlir").write_text(text)
        checksums = {name: _text_sha256(text) for name, text in sorted(stages.items())}
        full = dict(meta, key=key, format=FORMAT, sha256=_sha256(staging / LIBRARY), stages=checksums)
        (staging / META).write_text(json.dumps(full, indent=1))
        final = root / key
        if final.exists() or final.is_symlink():
            remove(final)  # an old entry, or a file or link in its place
        os.replace(staging, final)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return DiskEntry(final, full, stages)
