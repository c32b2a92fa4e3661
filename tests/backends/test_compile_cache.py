"""The compile cache's disk entries: checked in full, repaired, and cleaned of leftovers."""

import json
import os
import time

import pytest

from mlir_nn.backends.compile_cache import read_entry
from mlir_nn.backends.cpu import clear_memory_cache, compile_kernel
from mlir_nn.support.disk_cache import STALE_SECONDS, cache_dir, sweep_stale
from tests.backends.test_cpu import _check_tiny, _tiny_graph


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    yield tmp_path
    clear_memory_cache()


def entry_of(scale):
    graph = _tiny_graph(scale)
    compile_kernel(graph)
    (folder,) = [p for p in cache_dir().iterdir()
                 if (p / "meta.json").exists() and f"{scale:e}" in (p / "linalg.mlir").read_text()]
    return graph, folder


def test_a_changed_stage_text_is_a_miss(private_cache):
    graph, folder = entry_of(0.25)
    assert read_entry(folder.name) is not None
    (folder / "llvm.mlir").write_text("module {}\n")
    assert read_entry(folder.name) is None
    clear_memory_cache()
    assert compile_kernel(graph).source == "compiled"


def test_swapped_entries_are_misses(private_cache):
    (g1, a), (_, b) = entry_of(0.25), entry_of(0.5)
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    assert read_entry(a.name) is None and read_entry(b.name) is None
    clear_memory_cache()
    assert compile_kernel(g1).source == "compiled"
    _check_tiny(g1, 0.25)


def test_a_file_where_an_entry_goes_is_repaired(private_cache):
    graph, folder = entry_of(0.75)
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.write_text("not an entry")
    clear_memory_cache()
    assert compile_kernel(graph).source == "compiled"
    assert folder.is_dir() and read_entry(folder.name) is not None  # once warned on every run
    clear_memory_cache()
    assert compile_kernel(graph).source == "disk"


def test_leftovers_of_killed_writers_are_removed_once_stale(private_cache):
    old = time.time() - STALE_SECONDS - 60
    (private_cache / ".staging-0123456789abcdef-x").mkdir()
    (private_cache / ".staging-0123456789abcdef-x" / "step.so").write_bytes(b"half")
    (private_cache / "egraph").mkdir()
    (private_cache / "egraph" / ".tmp-abc").write_bytes(b"half")
    for path in (private_cache / ".staging-0123456789abcdef-x", private_cache / "egraph" / ".tmp-abc"):
        os.utime(path, (old, old))
    (private_cache / ".tmp-young").write_bytes(b"a compile running right now")
    entry_of(0.125)  # a write sweeps the cache folder
    sweep_stale(private_cache / "egraph")
    names = {p.name for p in private_cache.iterdir()} | {p.name for p in (private_cache / "egraph").iterdir()}
    assert ".staging-0123456789abcdef-x" not in names and ".tmp-abc" not in names
    assert ".tmp-young" in names
    assert all(json.loads((p / "meta.json").read_text())["format"] == 2
               for p in private_cache.iterdir() if (p / "meta.json").exists())
