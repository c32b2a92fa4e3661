"""The compile cache's folder and the housekeeping every writer into it shares.

``~/.cache/mlir-nn``, or ``$MLIR_NN_CACHE_DIR``. Writers stage their files under
``.staging-`` folders or ``.tmp-`` names and rename them into place; leftovers of killed
writers are removed once they are an hour old.

The folder is a trust boundary: it holds shared objects and pickles that are loaded as
code. It is created private (0700), and one that another user owns or may write into is
refused (``UntrustedCacheError``) before anything is read from it.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from functools import cache
from pathlib import Path

TMP_PREFIX = ".tmp-"
STAGING_PREFIX = ".staging-"
STALE_SECONDS = 3600.0  # older leftovers of writers are from killed processes


class UntrustedCacheError(PermissionError):
    """The cache folder could be written by someone else: what it holds is not loaded."""


def cache_dir() -> Path:
    """The cache folder, created private (0700) when missing; an untrusted one is refused."""
    override = os.environ.get("MLIR_NN_CACHE_DIR")
    folder = Path(override).expanduser() if override else Path.home() / ".cache" / "mlir-nn"
    _check_private(str(folder))
    return folder


@cache
def _check_private(name: str) -> None:
    """Create ``name`` with mode 0700 if missing; refuse it if another user owns it or group or
    others may write into it (checked once per folder and process). A folder that cannot be
    made is left to the writers, for which it only costs a compile (``writable``)."""
    folder = Path(name)
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError:
        return
    info = folder.stat()
    if not stat.S_ISDIR(info.st_mode):
        return
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise UntrustedCacheError(f"mlir-nn's cache folder {folder} belongs to user {info.st_uid}, not to you: the "
                                  "compiled code in it is loaded as code, so it must be yours; set MLIR_NN_CACHE_DIR")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedCacheError(f"mlir-nn's cache folder {folder} may be written by other users (mode "
                                  f"{stat.S_IMODE(info.st_mode):o}): the compiled code in it is loaded as code; run "
                                  f"chmod go-w {folder}, or set MLIR_NN_CACHE_DIR to a private folder")


def writable() -> None:
    """A clear OSError unless the cache folder exists (or can be made) and can be written:
    what the cpu backend needs (its shared objects are linked and loaded from there)."""
    folder = cache_dir()
    if not folder.is_dir():
        raise NotADirectoryError(f"mlir-nn cannot create its cache folder {folder} (something else is in the way, "
                                 "or a parent is not writable); set MLIR_NN_CACHE_DIR to a folder of yours")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"mlir-nn's cache folder {folder} is not writable: compiled steps are stored and loaded "
                              "there; set MLIR_NN_CACHE_DIR to a folder of yours")


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
