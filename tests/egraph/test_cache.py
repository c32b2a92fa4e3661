"""Optimizer results cached on disk: reused across processes, never trusted when damaged."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlir_nn.egraph import optimize
from mlir_nn.egraph.cache import entry_path, load, optimize_cached
from tests.egraph.util import trace_mlp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_result_is_stored_and_reloaded(private_cache):
    graph, _, _ = trace_mlp([2, 8, 1], 10)
    optimized, report = optimize_cached(graph, 10)
    assert entry_path(graph, 10).is_file()
    again, again_report = load(graph, 10)
    assert again == optimized and str(again) == str(optimize(graph, 10)[0])
    assert again_report.nodes_after == report.nodes_after
    assert load(graph, 11) is None  # the batch estimate is part of the key


def test_a_damaged_entry_is_recomputed(private_cache):
    graph, _, _ = trace_mlp([2, 8, 1], 10)
    optimized, _ = optimize_cached(graph, 10)
    path = entry_path(graph, 10)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert load(graph, 10) is None
    assert optimize_cached(graph, 10)[0] == optimized
    assert load(graph, 10) is not None  # rewritten


def test_a_new_process_with_another_hash_seed_skips_egglog(private_cache):
    program = (
        "import sys\n"
        "from mlir_nn.cli import build_parser, build_step\n"
        "from mlir_nn.egraph.cache import optimize_cached\n"
        "from mlir_nn.jit import trace_step\n"
        "step, x, y = build_step(build_parser().parse_args(['compile', '--mlp', '2,8,1', '--batch', '10']))\n"
        "graph, _, _ = trace_step(step, [x, y], ['x', 'y'])\n"
        "optimized, _ = optimize_cached(graph, 10)\n"
        "print('egglog' in sys.modules, optimized.op_counts().get('linear', 0))\n"
    )

    def run(seed: str) -> str:
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    first = run("1")
    assert first[0] == "True" and int(first[1]) > 0
    assert run("2") == ["False", first[1]]


def _scaled_step_graph(lr):
    """A step with its learning rate baked in as a constant: same signature for every lr."""
    from mlir_nn.engine import Tensor
    from mlir_nn.jit import trace_step

    w = Tensor(np.ones((3, 2), np.float32))

    def step(x):
        loss = (x @ w).sum()
        w.assign(w - lr * (x.T @ (x @ w)))
        return loss

    return trace_step(step, [np.ones((4, 3), np.float32)], ["x"])[0]


def test_swapped_entries_are_misses_not_swapped_results(private_cache):
    slow, fast = _scaled_step_graph(0.001), _scaled_step_graph(0.5)
    slow_optimized, _ = optimize_cached(slow, 4)
    fast_optimized, _ = optimize_cached(fast, 4)
    a, b = entry_path(slow, 4), entry_path(fast, 4)
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)
    assert load(slow, 4) is None and load(fast, 4) is None  # each once returned the other's lr
    assert optimize_cached(slow, 4)[0] == slow_optimized


def test_a_folder_where_an_entry_goes_is_repaired(private_cache):
    graph, _, _ = trace_mlp([2, 5, 1], 10)
    path = entry_path(graph, 10)
    path.mkdir(parents=True)
    optimized, _ = optimize_cached(graph, 10)
    assert path.is_file() and load(graph, 10)[0] == optimized
