"""The CUDA pass pipeline text (``passes/cuda.pipeline``), read by section."""

from __future__ import annotations

from pathlib import Path

from mlir.ir import Module
from mlir.passmanager import PassManager

from mlir_nn.support.pipelines import shipped_dir

PIPELINE_FILE = shipped_dir() / "cuda.pipeline"


def read_sections(path: Path = PIPELINE_FILE) -> dict[str, list[str]]:
    """``[name]`` headers, one pass per line, ``#`` comments."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in path.read_text().splitlines():
        line = "" if raw.lstrip().startswith("#") else raw.strip()  # whole-line comments only
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
        elif current is None:
            raise ValueError(f"{path}: pass {line!r} before any [section] header")
        else:
            current.append(line)
    return sections


def run_section(module: Module, sections: dict[str, list[str]], name: str, **fill: str) -> None:
    """Run section ``name`` on ``module`` with ``{placeholders}`` filled in."""
    try:
        passes = sections[name]
    except KeyError:
        raise ValueError(f"cuda pipeline has no [{name}] section; have {', '.join(sections)}") from None
    text = ",".join(passes)
    for key, value in fill.items():
        text = text.replace("{" + key + "}", value)
    PassManager.parse(f"builtin.module({text})").run(module.operation)
