"""The compile cache: in memory and on disk, keyed by what determines the machine code.

Key: sha256 of (graph fingerprint, pipeline text, target, package version, LLVM opt
level). On disk (``~/.cache/mlir-nn``, or ``$MLIR_NN_CACHE_DIR``) an entry is a folder
``<key>/`` holding ``step.so``, the MLIR stages as text and ``meta.json`` with the
shared object's sha256. An entry whose metadata or checksum does not match is treated
as missing and rebuilt; it is never trusted.
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

LIBRARY = "step.so"
META = "meta.json"
FORMAT = 1


def cache_dir() -> Path:
    override = os.environ.get("MLIR_NN_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "mlir-nn"


def cache_key(fingerprint: str, pipeline_text: str, target: str, version: str, opt_level: int) -> str:
    parts = [f"format={FORMAT}", fingerprint, pipeline_text, target, version, f"O{opt_level}"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
        stages = {name: (folder / f"{name}.mlir").read_text() for name in meta.get("stages", [])}
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return DiskEntry(folder, meta, stages)


def write_entry(key: str, library: Path, meta: dict[str, Any], stages: dict[str, str]) -> DiskEntry:
    """Store ``library`` (moved) with metadata and stage texts; replaces any old entry atomically."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=root))
    try:
        shutil.move(str(library), staging / LIBRARY)
        for name, text in stages.items():
            (staging / f"{name}.mlir").write_text(text)
        full = dict(meta, key=key, format=FORMAT, sha256=_sha256(staging / LIBRARY), stages=sorted(stages))
        (staging / META).write_text(json.dumps(full, indent=1))
        final = root / key
        if final.exists():
            shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return DiskEntry(final, full, stages)
