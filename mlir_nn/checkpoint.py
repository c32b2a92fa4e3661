"""``save`` / ``load``: state dicts to one ``.npz`` file, without pickle.

Arrays become entries of the archive; everything around them (nested dicts and lists,
numbers, strings, booleans, None) is one JSON entry that refers to the arrays by name.

Saving is atomic: the archive is written to a temporary file in the target's folder,
flushed to disk and renamed over the target, so a killed or failed save leaves the old
checkpoint intact and a reader never sees a partial file (a killed save may leave a
``.<name>.*.tmp`` file beside it).

Loading is driven by the structure and checked before anything is read: only entries the
structure names are read, each must be a stored (uncompressed) numeric ``.npy`` whose
header agrees with its size in the archive, so memory stays bounded by the file's size;
no pickle, never code. A path that is not a regular file (``/dev/zero``, a pipe) is refused
before it is opened. Every problem is a ``CheckpointError`` (a ``ValueError``) naming
the file; a missing file is a ``FileNotFoundError``.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import zipfile
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

STRUCTURE = "__structure__"
FORMAT = "mlir-nn-checkpoint/1"
MAX_DEPTH = 100  # nesting levels of dicts and lists (a cycle would be infinite)
CHUNK = 1 << 24  # bytes read from the archive at a time


class CheckpointError(ValueError):
    """A file that is not a complete, well-formed mlir-nn checkpoint."""


def _encode(value: Any, arrays: dict[str, np.ndarray], where: str, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"save: {where[:200]}... is nested deeper than {MAX_DEPTH} levels (a cycle?)")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"save: {where} is an array of {value.dtype}; only numeric arrays can be saved")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"array": name}
    if isinstance(value, np.generic):
        return _encode(value.item(), arrays, where, depth)
    if isinstance(value, Mapping):
        return {"items": [[k, _encode(v, arrays, f"{where}[{k!r}]", depth + 1)] for k, v in value.items()
                          if _key(k, where)]}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, arrays, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"save: {where} is a {type(value).__name__}; a checkpoint holds dicts, lists, numbers, "
                    "strings and numeric arrays (no code)")


def _key(key: Any, where: str) -> bool:
    if not isinstance(key, (str, int)) or isinstance(key, bool):
        raise TypeError(f"save: {where} has a key of type {type(key).__name__}; expected str or int keys")
    return True


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` (a state dict, or anything with ``state_dict()``) to ``path`` (npz), atomically."""
    if hasattr(obj, "state_dict"):
        obj = obj.state_dict()
    arrays: dict[str, np.ndarray] = {}
    structure = {"format": FORMAT, "root": _encode(obj, arrays, "obj")}
    text = np.frombuffer(json.dumps(structure).encode(), dtype=np.uint8)
    target = os.path.realpath(os.fspath(path))  # a link is followed: its target is replaced
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays, **{STRUCTURE: text})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    _sync_folder(folder)


def _sync_folder(folder: str) -> None:
    """Make the rename durable (where the platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Reader:
    """The archive at ``path``: entries read on request, each checked before it is read."""

    def __init__(self, archive: zipfile.ZipFile, path: str) -> None:
        self.archive, self.path = archive, path
        self.arrays: dict[str, np.ndarray] = {}

    def fail(self, message: str) -> CheckpointError:
        return CheckpointError(f"load: {self.path}: {message}")

    def array(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            self.arrays[name] = self._read(name)
        return self.arrays[name]

    def _read(self, name: str) -> np.ndarray:
        try:
            info = self.archive.getinfo(f"{name}.npy")
        except KeyError:
            raise self.fail(f"the structure names an array {name!r} that the archive does not hold") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise self.fail(f"entry {info.filename} is compressed; mlir_nn.save stores arrays uncompressed")
        try:
            with self.archive.open(info) as f:
                shape, fortran, dtype = _header(f)
                if dtype.kind not in "biuf":
                    raise self.fail(f"entry {info.filename} holds {dtype}; a checkpoint holds numeric arrays only")
                if any(d < 0 for d in shape):
                    raise self.fail(f"entry {info.filename} claims shape {shape}; a dimension cannot be negative")
                size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if size != info.file_size - f.tell():
                    raise self.fail(f"entry {info.filename} claims shape {shape} of {dtype} ({size} bytes), but "
                                    f"holds {info.file_size - f.tell()} bytes")
                data = bytearray(size)
                view, done = memoryview(data), 0
                while done < size:
                    count = f.readinto(view[done:done + CHUNK])
                    if not count:
                        raise self.fail(f"entry {info.filename} is truncated")
                    done += count
                f.read(1)  # reaching the end checks the entry's CRC
        except CheckpointError:
            raise
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
            raise self.fail(f"entry {info.filename} is corrupt ({e})") from e
        return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")

    def structure(self) -> Any:
        if f"{STRUCTURE}.npy" not in self.archive.namelist():
            raise CheckpointError(f"load: {self.path} is not an mlir-nn checkpoint (no {STRUCTURE} entry)")
        raw = self.array(STRUCTURE)
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise self.fail(f"the {STRUCTURE} entry is {raw.dtype} of shape {raw.shape}, expected uint8 text")
        try:
            structure = json.loads(raw.tobytes().decode())
        except RecursionError:
            raise self.fail(f"the structure is nested deeper than {MAX_DEPTH} levels") from None
        except (UnicodeDecodeError, ValueError) as e:
            raise self.fail(f"the structure is not valid JSON text ({e})") from None
        if not isinstance(structure, dict) or structure.get("format") != FORMAT:
            found = structure.get("format") if isinstance(structure, dict) else type(structure).__name__
            raise self.fail(f"has format {found!r}, expected {FORMAT!r}")
        if "root" not in structure:
            raise self.fail("the structure has no root")
        return structure["root"]

    def decode(self, node: Any, where: str = "root", depth: int = 0) -> Any:
        """The value ``node`` describes, each node checked against the format."""
        if depth > MAX_DEPTH:
            raise self.fail(f"the structure is nested deeper than {MAX_DEPTH} levels")
        if not isinstance(node, dict) or len(node) != 1:
            raise self.fail(f"{where} is {_short(node)}; expected one of {{'array': name}}, {{'items': [...]}}, "
                            "{'list': [...]}, {'value': ...}")
        (kind, body), = node.items()
        if kind == "array" and isinstance(body, str):
            return self.array(body)
        if kind == "list" and isinstance(body, list):
            return [self.decode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(body)]
        if kind == "items" and isinstance(body, list):
            out = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (str, int))
                        and not isinstance(pair[0], bool)):
                    raise self.fail(f"{where} has an item {_short(pair)}; expected [str or int key, value]")
                out[pair[0]] = self.decode(pair[1], f"{where}[{pair[0]!r}]", depth + 1)
            return out
        if kind == "value" and (body is None or isinstance(body, (bool, int, float, str))):
            return body
        raise self.fail(f"{where} is {_short(node)}; expected one of {{'array': name}}, {{'items': [...]}}, "
                        "{'list': [...]}, {'value': number, string, bool or null}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _header(f: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the ``.npy`` stream ``f``, read up to its data."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f"unsupported .npy version {version}")


def load(path: str | os.PathLike) -> Any:
    """Read what ``save`` wrote: the same nested dicts, lists and numpy arrays."""
    name = os.fspath(path)
    if not stat.S_ISREG(os.stat(name).st_mode):  # a missing file: FileNotFoundError naming it
        raise CheckpointError(f"load: {name} is not a regular file (a folder, device or pipe, which reading could "
                              "wait on forever); a checkpoint is a file that mlir_nn.save wrote")
    with open(name, "rb") as f:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
            raise CheckpointError(f"load: {name} is not an mlir-nn checkpoint (not a complete zip archive: {e})") \
                from None
        with archive:
            reader = _Reader(archive, name)
            return reader.decode(reader.structure())
