"""C sources of the cpu backend built once per machine into the compile cache folder.

A source is compiled with the machine's C compiler the first time a process needs it, into
``<cache>/<folder>/<key>/<file>``, the key hashing the source and whatever else the build
depends on; it is written atomically with its checksum beside it and loaded from there
afterwards. A file whose checksum does not match is rebuilt, never loaded. ``prepare``
starts the compiler in the background (a cold compile calls it first, so that ``cc`` runs
while egglog and LLVM do); ``path`` waits for that build, or builds, and returns the file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from mlir_nn.backends.errors import NativeError
from mlir_nn.support.disk_cache import STAGING_PREFIX, cache_dir, sweep_stale


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checksum_file(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def intact(target: Path) -> bool:
    """True when ``target`` exists and matches the checksum written beside it."""
    try:
        return target.is_file() and _checksum_file(target).read_text() == _sha256(target)
    except OSError:
        return False


class CBuild:
    """One C source and how to build it into a shared object.

    ``flags`` (compiler arguments besides ``-shared -fPIC -O2``, source and output) and
    ``key_parts`` (what the built file depends on besides its source) are asked for once
    per process, when the target is first needed; ``what`` names it in errors."""

    def __init__(self, source: Path, folder: str, file: str, what: str,
                 flags: Callable[[], list[str]], key_parts: Callable[[], list[bytes]]) -> None:
        self.source, self.folder, self.file, self.what = source, folder, file, what
        self._flags, self._key_parts = flags, key_parts
        self._key: str | None = None
        self._lock = threading.Lock()
        self._building: tuple[subprocess.Popen, Path, Path] | None = None  # (compiler, its output, target)

    def key(self) -> str:
        """sha256 prefix of the source and the key parts (hashed once per process)."""
        if self._key is None:
            parts = [self.source.read_bytes(), *self._key_parts()]
            self._key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:24]
        return self._key

    def target(self) -> Path:
        return cache_dir() / self.folder / self.key() / self.file

    def building(self) -> bool:
        """True while a build started by ``prepare`` is not yet collected by ``path``."""
        return self._building is not None

    def prepare(self) -> None:
        """Start building in the background unless the cache holds the file intact."""
        with self._lock:
            if self._building is None:
                target = self.target()
                if not intact(target):
                    self._building = (*self._start(target), target)

    def path(self) -> Path:
        """The built file: a build started by ``prepare`` finished, or a new one run now
        unless the cache holds it intact."""
        with self._lock:
            building, self._building = self._building, None
            if building is not None:
                self._finish(*building)
                target = building[2]
            else:
                target = self.target()
            if not intact(target):
                self._finish(*self._start(target), target)
            return target

    def load_global(self) -> ctypes.CDLL:
        """The built shared object (``path``) loaded with global symbols, which the compiled steps'
        shared objects bind their calls to."""
        target = self.path()
        try:
            return ctypes.CDLL(str(target), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise NativeError(f"loading the {self.what} {target} failed: {error}") from None

    def _start(self, target: Path) -> tuple[subprocess.Popen, Path]:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise NativeError(f"no C compiler (cc or gcc) on PATH: the cpu backend builds its {self.what} "
                              f"({self.source.name}) with it once per machine")
        flags = self._flags()
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(target.parent)  # outputs of builds killed an hour ago or more
        fd, staging = tempfile.mkstemp(prefix=STAGING_PREFIX, suffix=".so", dir=target.parent)
        os.close(fd)
        command = [compiler, "-shared", "-fPIC", "-O2", *flags, str(self.source), "-o", staging]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return process, Path(staging)

    def _finish(self, process: subprocess.Popen, staging: Path, target: Path) -> None:
        """Wait for the compiler, then put its output in place with its checksum beside it."""
        output, _ = process.communicate()
        if process.returncode != 0:
            staging.unlink(missing_ok=True)
            raise NativeError(f"building the cpu backend's {self.what} failed: {output.strip()}")
        _checksum_file(target).write_text(_sha256(staging))
        os.replace(staging, target)
