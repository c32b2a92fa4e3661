"""The disk cache of CUDA artifacts: a compiled step per (graph, arch, compiler).

An entry is ``<cache_dir>/cuda/<key>.mlirnn``, the ``.mlirnn`` file itself (whose reader
checks every cubin's hash). Its key is the sha256 of the graph's fingerprint, the arch,
the package version and a digest of the CUDA compiler's sources (``mlir_nn/ir``, ``codegen``
and ``gpu``, the artifact format, the shipped ``cuda.pipeline`` and ``cuda_schedule.mlir``),
so artifacts for a GPU machine are built from the same tree that is sent there. An entry that does not read
back, or holds another graph or signature, is a miss and is rewritten.

With it a GPU machine without MLIR runs ``Trainer(..., backend="cuda")`` on steps compiled
elsewhere: ``benchmarks/make_gpu_artifacts.py`` fills a cache folder for the GPU check.
Reading an entry needs neither MLIR nor egglog.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import cache
from pathlib import Path

from mlir_nn.ir import Graph
from mlir_nn.runtime.artifact import Artifact, ArtifactError, signature_of
from mlir_nn.support.disk_cache import TMP_PREFIX, cache_dir, sweep_stale

FORMAT = 1


@cache
def compiler_digest() -> str:
    """sha256 of every source that decides a CUDA artifact's content (the backend's glue in
    ``backends/cuda.py`` only packages it; a change to what it packages bumps FORMAT)."""
    from mlir_nn.support.pipelines import shipped_dir

    package = Path(__file__).resolve().parents[1]
    sources = sorted([*(package / "gpu").rglob("*.py"), *(package / "codegen").rglob("*.py"),
                      *(package / "ir").rglob("*.py"), package / "runtime" / "artifact.py"])
    sources += [shipped_dir() / "cuda.pipeline", shipped_dir() / "cuda_schedule.mlir"]
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def entry_path(graph: Graph, arch: str) -> Path:
    return _path(graph.fingerprint(), arch)


def _path(fingerprint: str, arch: str) -> Path:
    """The entry of the graph with this fingerprint for ``arch``."""
    from mlir_nn.support.version import __version__

    key = "\0".join([f"format={FORMAT}", fingerprint, arch, __version__, compiler_digest()])
    return cache_dir() / "cuda" / (hashlib.sha256(key.encode()).hexdigest() + ".mlirnn")


def load(graph: Graph, arch: str) -> Artifact | None:
    """The cached artifact of ``graph`` for ``arch``, or None (missing or not checking out)."""
    fingerprint = graph.fingerprint()
    path = _path(fingerprint, arch)
    if not path.is_file():
        return None
    try:
        artifact = Artifact.read(path)
    except ArtifactError:
        return None
    if artifact.arch != arch or artifact.graph_fingerprint != fingerprint or artifact.signature != signature_of(graph):
        return None
    return artifact


def store(artifact: Artifact) -> Path | None:
    """Write ``artifact`` as the entry of the graph it was compiled from (its ``graph_fingerprint``)
    for its arch, atomically; returns its path, or None when the cache cannot be written (which
    only costs the next process a compile)."""
    path = _path(artifact.graph_fingerprint, artifact.arch)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(artifact.to_bytes())
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return None
    return path
