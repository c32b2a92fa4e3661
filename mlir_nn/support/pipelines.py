"""Pass pipelines: text files with one pass per line, loaded by name or from a path.

``load_pipeline("cpu")`` reads ``passes/cpu.pipeline`` (shipped with the package);
any other argument containing a path separator or ending in ``.pipeline`` is read as a
user's file. Blank lines and ``#`` comments are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SUFFIX = ".pipeline"


@dataclass(frozen=True)
class Pipeline:
    name: str
    passes: tuple[str, ...]

    @property
    def text(self) -> str:
        """Canonical text (one pass per line): part of the compile cache key."""
        return "\n".join(self.passes) + "\n"

    def as_mlir(self) -> str:
        """The textual form PassManager.parse takes: ``builtin.module(a,b,...)``."""
        return "builtin.module(" + ",".join(self.passes) + ")"


def parse_pipeline(text: str, name: str = "<text>") -> Pipeline:
    passes = tuple(line.split("#", 1)[0].strip() for line in text.splitlines())
    passes = tuple(p for p in passes if p)
    if not passes:
        raise ValueError(f"pipeline {name}: no passes (one pass per line, '#' starts a comment)")
    return Pipeline(name, passes)


def shipped_dir() -> Path:
    """Where the shipped ``*.pipeline`` files live (package data, or the source tree's passes/)."""
    packaged = resources.files("mlir_nn") / "passes"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "passes"


def available() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*" + SUFFIX))


def load_pipeline(name_or_path: str | Path) -> Pipeline:
    """A shipped pipeline by name (``"cpu"``) or a user's pipeline file by path."""
    text = str(name_or_path)
    if "/" in text or text.endswith(SUFFIX) or isinstance(name_or_path, Path):
        path = Path(text)
        if path.is_dir():
            raise IsADirectoryError(f"pipeline file {path} is a directory; expected a text file, one pass per line")
        if not path.exists():
            raise FileNotFoundError(f"pipeline file {path} does not exist")
        if not path.is_file():
            raise ValueError(f"pipeline file {path} is not a regular file; expected a text file, one pass per line")
        try:
            return parse_pipeline(path.read_text(encoding="utf-8"), str(path))
        except UnicodeDecodeError as error:
            raise ValueError(f"pipeline file {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    path = shipped_dir() / (text + SUFFIX)
    if not path.is_file():
        raise ValueError(f"unknown pipeline {text!r}; shipped pipelines: {', '.join(available())}")
    return parse_pipeline(path.read_text(), text)
