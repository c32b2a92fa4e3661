"""Tiered execution: interpreted first calls while another process compiles, then native code.

Parameters after the switch are compared with a step that ran on the reference backend
throughout: float32 atol 2e-4, as in tests/backends/test_cpu.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.backends import kernel_pool
from mlir_nn.backends.buffered import BufferedExecutable
from mlir_nn.backends.cpu import clear_memory_cache, serial_pipeline
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.native import OPT_LEVEL
from mlir_nn.jit import tiered
from mlir_nn.jit.tiered import (
    ENV,
    FIRST_TIER_ENV,
    QUICK_OPT_LEVEL,
    first_tier_default,
    tiered_default,
)
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.support.pipelines import load_pipeline
from mlir_nn.trainer import train_step

SIZES = [3, 6, 5, 1]  # a step no other test compiles, so its first compile is a cold one


def _step(backend: str, tiered: bool):
    np.random.seed(11)
    model = MLP(SIZES[0], SIZES[1:])
    return jit(train_step(model, SGD(model.parameters(), lr=0.03)), backend=backend, tiered=tiered), model


def _batches(count: int):
    rng = np.random.default_rng(3)
    for _ in range(count):
        x = rng.standard_normal((9, SIZES[0])).astype(np.float32)
        yield x, np.tanh(x.sum(axis=1, keepdims=True))


def test_a_tiered_step_is_interpreted_until_its_compile_is_done_then_native():
    tiered, tiered_model = _step("cpu", tiered=True)
    reference, reference_model = _step("numpy", tiered=False)
    batches = list(_batches(40))
    for x, y in batches[:3]:
        np.testing.assert_allclose(tiered(x, y), reference(x, y), rtol=1e-6)  # both on the interpreter
    compiled = tiered._last
    assert compiled.tier == "numpy" and "llvm" not in compiled.stages
    assert isinstance(compiled.executable, BufferedExecutable)
    compiled._background.wait(timeout=300)
    for x, y in batches[3:]:
        np.testing.assert_allclose(tiered(x, y), reference(x, y), rtol=2e-4, atol=2e-5)
    assert compiled.tier == "cpu" and "llvm" in compiled.stages
    for p, q in zip(tiered_model.parameters(), reference_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4)
    again, _ = _step("cpu", tiered=True)  # both caches hold the step now: native from the first call
    again(*batches[0])
    assert again._last.tier == "cpu"


def test_switching_to_the_compiled_step_starts_no_compile_worker(monkeypatch, tmp_path):
    """The compile process filled the caches: loading its step here needs no worker process."""
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    step, _ = _step("cpu", tiered=True)
    x, y = next(_batches(1))
    step(x, y)
    compiled = step._last
    compiled._background.wait(timeout=300)
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "3")
    alive = sum(w.alive() for w in kernel_pool._WORKERS)
    compiled.finish_compile()
    assert compiled.tier == "cpu"
    assert sum(w.alive() for w in kernel_pool._WORKERS) == alive


def test_lower_waits_for_the_compile():
    step, _ = _step("cpu", tiered=True)
    x, y = next(_batches(1))
    assert "llvm.func" in step.lower(x, y).as_text("llvm")


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    assert not tiered_default() and not jit(lambda x: x).tiered
    monkeypatch.delenv(ENV)
    assert tiered_default()
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match="MLIR_NN_TIERED must be 0 or 1, got 'yes'"):
        jit(lambda x: x)


FIRST_STEP = """
import json, sys, time
start = time.perf_counter()
import numpy as np
from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.support.pipelines import load_pipeline
from mlir_nn.trainer import train_step

model = MLP(2, [32, 32, 16, 1])
step = jit(train_step(model, SGD(model.parameters(), lr=0.005)))
step(np.ones((10, 2), np.float32), np.ones((10, 1), np.float32))
print(json.dumps({"seconds": time.perf_counter() - start, "tier": step._last.tier,
                  "loaded": sorted(m for m in ("egglog", "mlir") if m in sys.modules)}))
"""


def test_a_cold_first_step_loads_neither_egglog_nor_mlir(tmp_path):
    env = dict(os.environ, MLIR_NN_CACHE_DIR=str(tmp_path), **{ENV: "1"})
    result = subprocess.run([sys.executable, "-c", FIRST_STEP], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["tier"] == "numpy" and report["loaded"] == []


QUICK_BUILDS = """
import json
import numpy as np
from mlir_nn import jit
from mlir_nn.backends import task_runtime, thin_call
from mlir_nn.jit.pipeline import StepPipeline
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import Adam
from mlir_nn.trainer import train_step

StepPipeline("cpu", tiered=True, first_tier="interpreter").before_trace()
interpreter = thin_call.BUILD.building()
StepPipeline("cpu", tiered=True, first_tier="native").before_trace()
native = thin_call.BUILD.building()
outputs = []
for backend in ("cpu", "numpy"):
    np.random.seed(17)
    model = MLP(4, [9, 2])
    step = jit(train_step(model, Adam(model.parameters(), lr=0.01), mse_loss), backend=backend)
    rng = np.random.default_rng(2)
    outputs.append([float(step(rng.standard_normal((n, 4)).astype(np.float32),
                               rng.standard_normal((n, 2)).astype(np.float32))) for n in (1, 7, 13, 33)])
    if backend == "cpu":
        tier, tasks = step._last.tier, task_runtime.BUILD.building() or task_runtime.load.cache_info().currsize
print(json.dumps({"interpreter": interpreter, "native": native, "tier": tier, "tasks": bool(tasks),
                  "outputs": outputs}))
"""


def test_the_native_first_tier_builds_the_call_extension_from_the_trace_on_and_no_task_runtime(tmp_path):
    """A fresh process and cache folder: the native first tier starts ``cc`` on the call extension
    as the trace begins (the interpreter tier leaves it to its compile process), and its code
    without threads neither builds nor loads the task runtime; its losses match the reference."""
    env = dict(os.environ, MLIR_NN_CACHE_DIR=str(tmp_path), **{ENV: "1", FIRST_TIER_ENV: "native"})
    result = subprocess.run([sys.executable, "-c", QUICK_BUILDS], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert not report["interpreter"] and report["native"]
    assert report["tier"] == "quick" and not report["tasks"]
    np.testing.assert_allclose(*report["outputs"], rtol=2e-4, atol=2e-5)


def test_when_no_compile_process_can_start_the_first_call_compiles_in_this_one(monkeypatch):
    np.random.seed(12)
    model = MLP(SIZES[0], SIZES[1:])
    step = jit(train_step(model, SGD(model.parameters(), lr=0.0301)), tiered=True)  # a graph no test compiled
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    step(*next(_batches(1)))
    assert step._last.tier == "cpu"


@pytest.mark.parametrize("setting,error,match", [
    ({"MLIR_NN_NUM_THREADS": "abc"}, ValueError, "MLIR_NN_NUM_THREADS='abc': expected a positive integer"),
    ({"MLIR_NN_COMPILE_WORKERS": "abc"}, ValueError, "MLIR_NN_COMPILE_WORKERS must be a number of processes"),
    ({"PATH": ""}, NativeError, r"no C compiler \(cc or gcc\) on PATH"),
    ({"MLIR_NN_CACHE_DIR": "{tmp}/file"}, NotADirectoryError, "cannot create its cache folder"),
])
def test_what_would_fail_a_later_call_fails_the_first(setting, error, match, tmp_path, monkeypatch):
    """Settings and toolchain are checked before a tiered step's first call runs on the interpreter."""
    (tmp_path / "file").write_text("in the way")
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached: the step must compile
    for name, value in setting.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    step, _ = _step("cpu", tiered=True)
    x, y = next(_batches(1))
    with pytest.raises(error, match=match):
        step(x, y)


def test_background_compiles_run_a_bounded_number_at_once(monkeypatch):
    """Many new steps at once queue their compiles: MAX_RUNNING processes, the rest start as
    those end (or when a step must wait for its own)."""
    from mlir_nn.jit import tiered
    from mlir_nn.jit.trace import trace_step

    monkeypatch.setattr(tiered, "MAX_RUNNING", 2)
    graphs = []
    for width in range(1, 6):
        model = MLP(2, [width, 1])
        graphs.append(trace_step(train_step(model, SGD(model.parameters(), lr=0.1)),
                                 [np.ones((3, 2), np.float32), np.ones((3, 1), np.float32)], ["x", "y"])[0])
    compiles = [tiered.BackgroundCompile(g, 3, False) for g in graphs]
    try:
        assert [c.started for c in compiles] == [True, True, False, False, False]
        assert not compiles[2].done()  # still queued: its step stays on the interpreter
        compiles[0].cancel()
        assert not compiles[3].done() and [c.started for c in compiles] == [True, True, True, False, False]
        compiles[4].wait(timeout=300)  # a step that must wait starts its compile at once
        assert compiles[4].done() and not compiles[3].started
    finally:
        for c in compiles:
            c.cancel()
    assert all(c.done() for c in compiles)


def test_a_held_compile_starts_at_its_release_or_when_its_step_waits():
    """The native first tier's compile is held until its first call has run (on both cores): not
    queued, not done, no process; ``release`` starts it; a step that must wait starts it too."""
    from mlir_nn.jit import tiered
    from mlir_nn.jit.trace import trace_step

    graphs = []
    for width in (3, 4):
        model = MLP(2, [width, 1])
        graphs.append(trace_step(train_step(model, SGD(model.parameters(), lr=0.1)),
                                 [np.ones((3, 2), np.float32), np.ones((3, 1), np.float32)], ["x", "y"])[0])
    released, waited = (tiered.BackgroundCompile(g, 3, False, held=True) for g in graphs)
    try:
        for held in (released, waited):
            assert held.held and not held.started and not held.done() and held not in tiered._QUEUE
        released.release()
        assert released.started and not released.held
        waited.wait(timeout=300)
        assert waited.done() and not waited.held
    finally:
        for c in (released, waited):
            c.cancel()


def test_a_native_first_tier_runs_quick_native_code_until_the_optimized_code_is_ready(monkeypatch):
    """``MLIR_NN_FIRST_TIER=native``: the first calls run code compiled here with LLVM at -O0,
    then the optimized code; both agree with the reference at awkward batch sizes. Through MLIR
    (the baseline compiler off; it has its own tests: tests/backends/test_baseline.py)."""
    from mlir_nn.backends.baseline import SWITCH
    from mlir_nn.losses import mse_loss
    from mlir_nn.optim import Adam

    monkeypatch.setenv(FIRST_TIER_ENV, "native")
    monkeypatch.setenv(SWITCH, "0")

    def make(backend: str, tiered: bool):
        np.random.seed(13)
        model = MLP(5, [7, 3])  # a step no other test compiles: its first compile is a cold one
        return jit(train_step(model, Adam(model.parameters(), lr=0.01), mse_loss), backend=backend,
                   tiered=tiered), model

    (quick, quick_model), (reference, reference_model) = make("cpu", True), make("numpy", False)
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((n, 5)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32))
               for n in (1, 7, 13, 33, 257)]
    for x, y in batches:
        np.testing.assert_allclose(quick(x, y), reference(x, y), rtol=2e-4, atol=2e-5)
    compiled = quick._last
    assert compiled.tier == "quick" and compiled.executable.kernel.opt_level == QUICK_OPT_LEVEL
    # the traced graph, without egglog, lowered whole on one thread while the optimized code compiles
    kernel = compiled.executable.kernel
    assert compiled.optimized_graph is compiled.graph and compiled.optimize_report is None
    assert kernel.pipeline == serial_pipeline(load_pipeline("cpu")) and not kernel.threaded
    assert "llvm" not in kernel.stages  # not printed: as_text waits for the optimized code (below)
    assert compiled._background.started and not compiled._background.held  # released by the first call
    compiled._background.wait(timeout=300)
    for x, y in batches[::-1]:
        np.testing.assert_allclose(quick(x, y), reference(x, y), rtol=2e-4, atol=2e-5)
    assert compiled.tier == "cpu" and compiled.executable.kernel.opt_level == OPT_LEVEL
    assert "llvm.func" in compiled.as_text("llvm")
    for p, q in zip(quick_model.parameters(), reference_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4)


def test_a_deep_step_on_the_native_first_tier_is_split_into_kernels(monkeypatch):
    """From ``QUICK_SPLIT_PRODUCTS`` matrix products on (7 layers with Adam: 20), the quick tier's
    step is split into kernels, compiled here on two cores: the step in LLVM's JIT, its kernels
    in an engine of MLIR's (``kernel_build.compile_resident_split``); it agrees with the
    reference at awkward batch sizes. One product fewer (the first layer's input gradient is not
    needed either way; 6 layers: 17) keeps the step whole, in one engine. (The baseline compiler,
    which would take these steps, off.)"""
    from mlir_nn.backends.baseline import SWITCH
    from mlir_nn.backends.engine_capi import Engine
    from mlir_nn.backends.llvm_jit import Jit
    from mlir_nn.losses import mse_loss
    from mlir_nn.optim import Adam

    monkeypatch.setenv(FIRST_TIER_ENV, "native")
    monkeypatch.setenv(SWITCH, "0")

    def make(backend: str, tiered: bool, depth: int):
        np.random.seed(19)
        model = MLP(3, [6] * (depth - 1) + [2])  # steps no other test compiles
        return jit(train_step(model, Adam(model.parameters(), lr=0.01), mse_loss), backend=backend,
                   tiered=tiered), model

    rng = np.random.default_rng(8)
    batches = [(rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((n, 2)).astype(np.float32))
               for n in (1, 7, 13, 33, 257)]
    for depth, split in ((7, True), (6, False)):
        (quick, quick_model), (reference, reference_model) = make("cpu", True, depth), make("numpy", False, depth)
        for x, y in batches:
            np.testing.assert_allclose(quick(x, y), reference(x, y), rtol=2e-4, atol=2e-5)
        compiled = quick._last
        assert compiled.tier == "quick" and tiered.quick_split(compiled.graph) == split
        assert compiled.executable.kernel.pipeline == serial_pipeline(load_pipeline("cpu"), split=split)
        assert "llvm" not in compiled.executable.kernel.stages  # (as_text waits for the optimized code)
        owner = compiled.executable.kernel.native.owner
        assert [type(part) for part in owner] == [Jit, Engine] if split else not isinstance(owner, tuple)
        for p, q in zip(quick_model.parameters(), reference_model.parameters()):
            np.testing.assert_allclose(p.data, q.data, atol=2e-4)
        compiled._background.cancel()


def test_the_first_tier_switch(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    monkeypatch.delenv(FIRST_TIER_ENV, raising=False)
    assert first_tier_default() == "interpreter" and jit(lambda x: x).pipeline.first_tier == "interpreter"
    monkeypatch.setenv(FIRST_TIER_ENV, "native")
    assert jit(lambda x: x).pipeline.first_tier == "native"
    assert jit(lambda x: x, tiered=False).pipeline.first_tier == "interpreter"  # no tiers: no first tier
    monkeypatch.setenv(FIRST_TIER_ENV, "fast")
    with pytest.raises(ValueError, match="MLIR_NN_FIRST_TIER must be interpreter or native, got 'fast'"):
        jit(lambda x: x)


def test_the_compile_process_leaves_a_core_to_the_interpreter_tier(monkeypatch):
    monkeypatch.delenv(kernel_pool.WORKERS_VARIABLE, raising=False)
    env = tiered.child_environment()
    assert env[kernel_pool.WORKERS_VARIABLE] == str(kernel_pool.default_count(beside=1))
    assert kernel_pool.default_count(beside=1) == max(0, kernel_pool.default_count() - 1)
    monkeypatch.setenv(kernel_pool.WORKERS_VARIABLE, "3")
    assert tiered.child_environment()[kernel_pool.WORKERS_VARIABLE] == "3"


def test_a_large_step_goes_to_its_compile_process_while_the_first_call_goes_on(tmp_path, monkeypatch):
    """A step's graph is written into the compile process's input on another thread: a payload
    over the pipe's 64 KiB would otherwise hold the first call until the process, still
    importing, read it. The process reads all of it (length first) and fills the caches."""
    from mlir_nn.jit.trace import trace_step
    from mlir_nn.optim import Adam

    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    model = MLP(8, [8] * 32 + [1])
    graph = trace_step(train_step(model, Adam(model.parameters())),
                       [np.ones((4, 8), np.float32), np.ones((4, 1), np.float32)], ["x", "y"])[0]
    background = tiered.BackgroundCompile(graph, 4, False)
    try:
        assert len(background._payload) > 1 << 16 and background._feeding.is_alive()
        background.wait(timeout=300)
    finally:
        background.cancel()
    assert background._process.returncode == 0 and tiered.from_caches(graph, 4, False) is not None
