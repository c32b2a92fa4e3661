"""The compile cache's folder and the housekeeping every writer into it shares.

``~/.cache/mlir-nn``, or ``$MLIR_NN_CACHE_DIR``. Writers stage their files under
``.staging-`` folders or ``.tmp-`` names and rename them into place; leftovers of killed
writers are removed once they are an hour old.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

TMP_PREFIX = ".tmp-"
STAGING_PREFIX = ".staging-"
STALE_SECONDS = 3600.0  # older leftovers of writers are from killed processes


def cache_dir() -> Path:
    override = os.environ.get("MLIR_NN_CACHE_DIR")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "mlir-nn"


def remove(path: Path) -> None:
    """Delete whatever is at ``path`` (file, link or folder); missing is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep_stale(folder: Path, max_age: float = STALE_SECONDS) -> None:
    """Remove staging folders and temporary files in ``folder`` older than ``max_age`` seconds
    (younger ones may belong to a compile running in another process)."""
    now = time.time()
    try:
        leftovers = [p for p in folder.iterdir() if p.name.startswith((TMP_PREFIX, STAGING_PREFIX))]
    except OSError:
        return
    for path in leftovers:
        try:
            if now - path.lstat().st_mtime > max_age:
                remove(path)
        except OSError:
            continue
