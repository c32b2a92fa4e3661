"""Optimizer results on disk, so a new process skips egglog for a step it has optimized before.

Key: (format, traced graph fingerprint, batch estimate, a digest of the optimizer's
sources); the file name is its sha256. An entry is ``<cache dir>/egraph/<sha>.pickle``: a
sha256 of the payload, then the pickled (full key, optimized graph, report). An entry
that fails the checksum, holds another key (e.g. a file copied or renamed over it), does
not unpickle to a graph that verifies, or changes the step's signature is ignored and
recomputed; it is never trusted. ``.tmp-`` files left by killed writers are removed
once they are old (see ``mlir_nn.backends.compile_cache.sweep_stale``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from mlir_nn.egraph.deferred_black import black_deferred
from mlir_nn.ir import Graph, VerifyError, verify
from mlir_nn.support.disk_cache import TMP_PREFIX, cache_dir, remove, sweep_stale
from mlir_nn.support.interrupts import interrupts_deferred

if TYPE_CHECKING:
    from mlir_nn.egraph.report import Report

FORMAT = 2
DIGEST_SIZE = 32


@cache
def optimizer_digest() -> str:
    """sha256 of every source file of the optimizer, of the op registry (its window ops and their
    layouts included) and of the convolution forms' cost."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    ir_files = ("ops.py", "windows.py", "layouts.py", "conv_forms.py")
    for path in sorted(package.rglob("*.py")) + [package.parent / "ir" / name for name in ir_files]:
        digest.update(str(path.relative_to(package.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def entry_key(graph: Graph, batch_estimate: int | None) -> str:
    """The full key of ``graph``'s entry, stored in the entry and checked on load."""
    return "\0".join([f"format={FORMAT}", graph.fingerprint(), str(batch_estimate), optimizer_digest()])


def entry_path(graph: Graph, batch_estimate: int | None) -> Path:
    return cache_dir() / "egraph" / (hashlib.sha256(entry_key(graph, batch_estimate).encode()).hexdigest() + ".pickle")


def _same_signature(a: Graph, b: Graph) -> bool:
    return (a.inputs, a.params, len(a.outputs), [n for n, _ in a.updates]) == (
        b.inputs, b.params, len(b.outputs), [n for n, _ in b.updates])


def load(graph: Graph, batch_estimate: int | None) -> tuple[Graph, Report] | None:
    """The cached result for ``graph``, or None when there is none or it does not check out."""
    try:
        data = entry_path(graph, batch_estimate).read_bytes()
    except OSError:
        return None
    digest, payload = data[:DIGEST_SIZE], data[DIGEST_SIZE:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        key, optimized, report = pickle.loads(payload)
        if key != entry_key(graph, batch_estimate) or not isinstance(optimized, Graph):
            return None
        if not _same_signature(graph, optimized):
            return None
        verify(optimized)
    except (pickle.UnpicklingError, VerifyError, ValueError, TypeError, AttributeError, EOFError, ImportError):
        return None
    return optimized, report


def store(graph: Graph, batch_estimate: int | None, result: tuple[Graph, Report]) -> None:
    """Write the entry atomically; a failure only costs the next process an optimizer run."""
    path = entry_path(graph, batch_estimate)
    try:
        payload = pickle.dumps((entry_key(graph, batch_estimate), *result), protocol=pickle.HIGHEST_PROTOCOL)
    except RecursionError:  # an extremely deep graph: not worth caching
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(path.parent)
        if path.is_dir() and not path.is_symlink():
            remove(path)  # something else sits where the entry goes: repair it
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def optimize_cached(graph: Graph, batch_estimate: int | None = None) -> tuple[Graph, Report]:
    """``optimize(graph, batch_estimate)``, from the disk cache when this step was seen before."""
    cached = load(graph, batch_estimate)
    if cached is not None:
        return cached
    # egglog's declarations (the Term class, the rules) are made as they load; black, which egglog
    # imports to format what it prints, loads only if something is printed
    with interrupts_deferred(), black_deferred():
        from mlir_nn.egraph.driver import optimize

    result = optimize(graph, batch_estimate)
    if result[1].error is None:
        store(graph, batch_estimate, result)
    return result
