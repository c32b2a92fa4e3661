"""The kernel cache: a new step compiles only its new kernels; broken entries are misses and rebuilt."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mlir_nn.backends import cpu, kernel_cache, kernel_pool
from mlir_nn.backends.native import objcopy
from mlir_nn.backends.reference import evaluate
from mlir_nn.ir import Graph
from mlir_nn.support.disk_cache import TMP_PREFIX
from mlir_nn.support.pipelines import load_pipeline
from tests.codegen.zoo import arguments, matmul_zoo


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """A fresh cache folder; steps compiled by this process alone (a cold build: one object)."""
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "0")
    cpu.clear_memory_cache()
    yield tmp_path / kernel_cache.FOLDER
    cpu.clear_memory_cache()


def _renamed(graph: Graph, outputs: slice, name: str) -> Graph:
    return Graph(graph.inputs, graph.params, graph.outputs[outputs], name=name)


def _keys(graph: Graph) -> dict[str, str]:
    """kernel -> its key in the kernel cache."""
    *_, split, _ = cpu.lower_with_plan(graph, load_pipeline("cpu"))
    return cpu.kernel_keys(split, cpu.tail_pipeline(load_pipeline("cpu")))


def _kernels(graph: Graph) -> set[str]:
    return set(_keys(graph))


def _indexes(folder) -> dict[str, str]:
    """index file -> the object it names."""
    return {p.name: json.loads(p.read_text())["object"] for p in folder.iterdir() if "." not in p.name}


def _undefined(path: Path) -> list[str]:
    """The symbols that the object file ``path`` uses but does not define."""
    tool = Path(objcopy()).with_name("llvm-nm")
    done = subprocess.run([str(tool) if tool.is_file() else "nm", "--undefined-only", str(path)],
                          capture_output=True, text=True, check=True)
    return [line.split()[-1] for line in done.stdout.splitlines() if line.strip()]


def _check(graph: Graph) -> None:
    kernel = cpu.compile_kernel(graph)
    assert kernel.source == "compiled"
    inputs, params = arguments(graph, 6, np.random.default_rng(1))
    want, want_params = evaluate(graph, inputs, [p.copy() for p in params], 6)
    got = cpu.CpuExecutable(graph, kernel).run(inputs, params)
    for g, w in zip(got + params, want + want_params):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5)


def test_a_new_step_compiles_only_the_kernels_no_step_compiled_before(private_cache):
    zoo = matmul_zoo(7, 13, "float32")
    first, second = _renamed(zoo, slice(0, 6), "first"), _renamed(zoo, slice(3, 10), "second")
    old, new = _kernels(first), _kernels(second)
    assert old & new and new - old  # the two steps share some kernels, not all
    _check(first)
    after_first = _indexes(private_cache)
    assert len(after_first) == len(old) and len(set(after_first.values())) == 1  # one object for all
    _check(second)
    after_second = _indexes(private_cache)
    assert len(after_second) == len(old | new)
    added = {after_second[key] for key in after_second.keys() - after_first.keys()}
    assert len(added) == 1 and not added & set(after_first.values())  # one new object
    (digest,) = added
    assert set(json.loads((private_cache / f"{digest}.json").read_text())["kernels"]) == new - old
    text = (private_cache / f"{digest}.mlir").read_text()
    assert {k for k in new if re.search(rf"llvm\.func @{k}\(%", text)} == new - old  # compiled only these
    _check(_renamed(zoo, slice(0, 10), "third"))  # everything cached: only the step is compiled
    assert _indexes(private_cache) == after_second
    for path in private_cache.glob("*.o"):  # no object needs a kernel of another one
        assert not [s for s in _undefined(path) if re.fullmatch(r"k[0-9a-f]+", s)]


def test_corrupt_or_half_written_entries_are_misses_and_rebuilt(private_cache):
    zoo = matmul_zoo(5, 9, "float64")
    _check(_renamed(zoo, slice(0, 10), "first"))
    keys = _keys(_renamed(zoo, slice(0, 10), "first"))
    assert len(kernel_cache.lookup(keys)) == len(keys)
    indexes = _indexes(private_cache)
    (target,) = set(indexes.values())
    whole = (private_cache / f"{target}.o").read_bytes()
    (private_cache / f"{target}.o").write_bytes(whole[:len(whole) // 2])  # a writer killed halfway
    broken_index = sorted(indexes)[0]
    (private_cache / broken_index).write_text('{"object": ')
    assert kernel_cache.lookup(keys) == {}
    (private_cache / "garbage").write_text("not json")  # stray files are not entries
    (private_cache / f"{TMP_PREFIX}leftover").write_bytes(b"\0" * 16)
    _check(_renamed(zoo, slice(0, 10), "second"))
    found = kernel_cache.lookup(keys)
    assert len(found) == len(keys) and all(stored.path.read_bytes()[:4] == b"\x7fELF" for stored in found.values())


def test_stores_rename_whole_files_into_place(private_cache, tmp_path):
    obj = tmp_path / "a.o"
    obj.write_bytes(b"\x7fELF object")
    kernel_cache.store(obj, "module {}\n", {"ka": "key-a", "kb": "key-b"})
    obj.write_bytes(b"\x7fELF other object")
    kernel_cache.store(obj, "module {\n}\n", {"kb": "key-b"})  # kb's index now names the second object
    assert not [p for p in private_cache.iterdir() if p.name.startswith(TMP_PREFIX)]
    found = kernel_cache.lookup({"ka": "key-a", "kb": "key-b"})
    assert found["ka"].path.read_bytes() == b"\x7fELF object" and found["ka"].kernels == {"ka", "kb"}
    assert found["kb"].path.read_bytes() == b"\x7fELF other object" and found["kb"].text == "module {\n}\n"


def test_objects_to_link_define_each_kernel_once():
    a, b, c = (kernel_cache.StoredObject(Path(name), "", frozenset(kernels))
               for name, kernels in (("a.o", {"k1", "k2"}), ("b.o", {"k1", "k3"}), ("c.o", {"k4"})))
    chosen, fresh = kernel_cache.select(["k2", "k3", "k4", "k5"], {"k2": a, "k3": b, "k4": c})
    assert {s.path.name for s in chosen} in ({"a.o", "c.o"}, {"b.o", "c.o"})  # a and b both define k1
    assert sorted(fresh) == (["k3", "k5"] if chosen[0] is a else ["k2", "k5"])
    chosen, fresh = kernel_cache.select(["k1", "k2", "k3"], {"k1": b, "k2": a, "k3": b})
    assert [s.path.name for s in chosen] == ["a.o"] and fresh == ["k3"]  # the one with most kernels first
    big = kernel_cache.StoredObject(Path("big.o"), "", frozenset({"k1", "k2", "k3", "k6"}))
    chosen, fresh = kernel_cache.select(["k1", "k4"], {"k1": big, "k4": c})
    assert [s.path.name for s in chosen] == ["c.o"] and fresh == ["k1"]  # mostly kernels the step lacks


def test_cached_objects_that_define_the_same_kernel_are_not_linked_together(private_cache):
    zoo = matmul_zoo(6, 11, "float32")
    _check(_renamed(zoo, slice(0, 6), "first"))
    first = {p.name: p.read_bytes() for p in private_cache.iterdir() if "." not in p.name}
    for name in first:
        (private_cache / name).unlink()
    _check(_renamed(zoo, slice(3, 10), "second"))  # compiles the kernels it shares with the first again
    for name, data in first.items():
        if not (private_cache / name).exists():
            (private_cache / name).write_bytes(data)
    objects = [set(json.loads(p.read_text())["kernels"]) for p in private_cache.glob("*.json")]
    assert len(objects) == 2 and objects[0] & objects[1]
    _check(_renamed(zoo, slice(0, 10), "third"))  # needs both: links one, compiles the other's kernels
    assert len(list(private_cache.glob("*.json"))) == 3


def test_the_llvm_text_of_a_step_that_links_a_larger_object_has_only_its_own_kernels(private_cache):
    zoo = matmul_zoo(8, 12, "float32")
    _check(_renamed(zoo, slice(0, 10), "all"))
    part = _renamed(zoo, slice(1, 10), "part")
    own = _kernels(part)
    objects = len(list(private_cache.glob("*.json")))
    _check(part)
    assert len(list(private_cache.glob("*.json"))) == objects  # linked the object of the first: nothing compiled
    text = cpu.compile_kernel(part).stages["llvm"]
    assert set(re.findall(r"llvm\.func @(k\w+)\(", text)) == own


def test_a_step_links_a_cached_object_compiled_with_another_step_of_its_name(private_cache):
    zoo = matmul_zoo(9, 10, "float32")
    _check(_renamed(zoo, slice(0, 8), "step"))
    objects = len(list(private_cache.glob("*.json")))
    _check(_renamed(zoo, slice(0, 10), "step"))  # links the first's object: its step's symbols are local there
    assert len(list(private_cache.glob("*.json"))) == objects + 1


def test_objects_compiled_on_workers_are_cached_and_linked(private_cache, monkeypatch):
    zoo = matmul_zoo(7, 9, "float32")
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "1")
    kernel_pool.start()
    _check(_renamed(zoo, slice(0, 7), "first"))  # the step apart, its kernels in two objects (worker's, caller's)
    assert len(list(private_cache.glob("*.json"))) == 2
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "0")
    _check(_renamed(zoo, slice(0, 10), "second"))
    for path in private_cache.glob("*.o"):
        assert not [s for s in _undefined(path) if re.fullmatch(r"k[0-9a-f]+", s)]
