"""The team width of a threaded step's calls, chosen by measurement (``task_runtime.c``: "Team
width by measurement"): every thread or the caller alone, whichever the runtime times faster.

The logic runs on stand-in steps (Python callbacks whose time depends on the width they are
called on); a real threaded step runs on both widths with the same results.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from mlir_nn.backends import get_backend, task_runtime, thread_pool
from mlir_nn.backends.workspace import CHOICE_OFFSET, HEADER
from tests.backends.test_cpu_parallel import PARALLEL_FN, K, M
from tests.codegen.zoo import arguments, matmul_zoo

STEP = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
RING, BURST, PROBE_EVERY_MIN, PROBE_PERIOD_S, PROBE_PERIOD_ALL_S = 3, 3, 8, 1.0, 10.0  # task_runtime.c
LEARNING = ["all"] * BURST + ["alone"] * BURST  # bursts, the first call of each untimed


class StandIn:
    """A step that sleeps ``seconds[width]`` on the width it is called on, and records the widths."""

    def __init__(self, alone: float, all_: float) -> None:
        self.seconds = {"alone": alone, "all": all_}
        self.widths: list[str] = []
        self.header = np.zeros(HEADER, np.uint8)  # a workspace header: the choice, zeroed
        self._callback = STEP(self._run)

    def _run(self, args: int | None) -> None:
        width = "alone" if task_runtime.load().mlirnn_runtime_forks_alone() else "all"
        self.widths.append(width)
        time.sleep(self.seconds[width])

    def call(self, times: int) -> list[str]:
        """The widths of ``times`` more calls."""
        library = task_runtime.load()
        start = len(self.widths)
        for _ in range(times):
            library.mlirnn_runtime_run_step(self._callback, None,
                                            ctypes.c_void_p(self.header.ctypes.data + CHOICE_OFFSET))
        return self.widths[start:]


def test_both_widths_are_measured_in_bursts_then_the_faster_is_used():
    step = StandIn(alone=0.001, all_=0.004)
    assert task_runtime.team_choice(step.header)["using"] is None
    assert step.call(len(LEARNING)) == LEARNING
    assert step.call(10) == ["alone"] * 10
    choice = task_runtime.team_choice(step.header)
    assert choice["using"] == "alone" and choice["calls_all"] == BURST - 1
    assert choice["calls_alone"] == BURST - 1 + 10  # every call in a row on one width is timed
    assert choice["alone_ns"] < choice["all_ns"]
    assert choice["probe_every"] > 100  # the other width is 4x slower: probed rarely


def test_a_width_that_slows_down_is_left_within_a_few_calls():
    step = StandIn(alone=0.004, all_=0.001)
    step.call(len(LEARNING))
    assert step.call(3) == ["all"] * 3
    step.seconds["all"] = 0.008  # e.g. the host moved one core away from the other's cache
    widths = step.call(6)
    assert widths[:RING - 1] == ["all"] * (RING - 1) and widths[RING:] == ["alone"] * (6 - RING)


def test_when_the_widths_are_alike_the_other_is_probed_often():
    """Steps of 20 ms: a wake-up that the busy host delays by a few ms moves one burst's time by a
    few percent (with 1 ms steps, by a third or more: the widths read apart and probes went rare)."""
    step = StandIn(alone=0.02, all_=0.02)
    step.call(len(LEARNING))
    widths = step.call(4 * (PROBE_EVERY_MIN + BURST))
    assert "alone" in widths and "all" in widths  # bursts on the width not in use
    assert PROBE_EVERY_MIN <= task_runtime.team_choice(step.header)["probe_every"] < 100


def test_a_long_step_probes_the_other_width_at_least_once_a_second():
    """A width timed 4x slower is probed after PROBE_PERIOD_S of calls on the other, not after the
    900 calls its cost share allows: a burst timed while the host took a core away for a moment
    does not keep a 50 ms step on one width for minutes."""
    step = StandIn(alone=0.05, all_=0.2)
    step.call(len(LEARNING))
    every = round(PROBE_PERIOD_S / 0.05)
    choice = task_runtime.team_choice(step.header)
    assert choice["using"] == "alone" and PROBE_EVERY_MIN <= choice["probe_every"] <= every < 900
    step.seconds["all"] = 0.01  # the core is back: all threads are now the faster
    widths = step.call(every + 2 * BURST)
    assert "all" in widths and widths[-BURST:] == ["all"] * BURST


ALL_S = 0.02  # the stand-in's step on all threads in the cost-share test below


@pytest.mark.parametrize("alone, low, high", [  # (bounds that a wake-up delayed by a busy host leaves)
    (0.04, 100, 500),  # 3 x (40 - 20) / 20 / PROBE_COST: about 300 calls
    (0.2, 250, round(PROBE_PERIOD_ALL_S / ALL_S)),  # the cost share allows 2700: PROBE_PERIOD_ALL_S of calls
])
def test_a_long_step_on_all_threads_probes_alone_by_the_cost_share(alone, low, high):
    """A 20 ms step on all threads probes alone after as many calls as make a burst's extra time
    PROBE_COST of theirs, at most PROBE_PERIOD_ALL_S of calls, not once a second (50 calls): a burst
    alone each second cost the 784-1024-1024-10 step at batch 512 a tenth of its time."""
    step = StandIn(alone=alone, all_=ALL_S)
    step.call(len(LEARNING))
    choice = task_runtime.team_choice(step.header)
    assert choice["using"] == "all" and round(PROBE_PERIOD_S / ALL_S) < low < choice["probe_every"] <= high


def test_a_threaded_step_gives_the_same_results_on_either_width(monkeypatch):
    if thread_pool.num_threads() < 2:
        pytest.skip("one computing thread: every call runs alone")
    graph = matmul_zoo(K, M, "float32")
    monkeypatch.setenv(thread_pool.WIDTH_ENV, "all")
    every = get_backend("cpu").compile(graph)
    monkeypatch.setenv(thread_pool.WIDTH_ENV, "measured")
    measured = get_backend("cpu").compile(graph)
    assert PARALLEL_FN in measured.stages["llvm"]
    batch = 301
    inputs, params = arguments(graph, batch, np.random.default_rng(0))
    for _ in range(3 * len(LEARNING)):
        want = every.run(inputs, [p.copy() for p in params])
        got = measured.run(inputs, [p.copy() for p in params])
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)  # each row block is one task's on either width
    choice = measured.team_choice(batch)
    assert choice["calls_alone"] >= BURST - 1 and choice["calls_all"] >= BURST - 1
    assert choice["using"] in ("alone", "all")
    assert every.team_choice(batch) == {"calls_alone": 0, "calls_all": 0, "alone_ns": 0, "all_ns": 0,
                                        "using": None, "probe_every": 0}
    assert measured.team_choice(batch + 1) is None  # no call at that size


def test_the_width_setting_is_checked(monkeypatch):
    monkeypatch.setenv(thread_pool.WIDTH_ENV, "half")
    with pytest.raises(ValueError, match="MLIR_NN_TEAM_WIDTH='half': expected one of measured, all"):
        task_runtime.step_runner()
    monkeypatch.setenv(thread_pool.WIDTH_ENV, "all")
    assert task_runtime.step_runner() == 0
    monkeypatch.setenv(thread_pool.WIDTH_ENV, "measured")
    monkeypatch.setenv(thread_pool.ENV, "1")
    assert task_runtime.step_runner() == 0  # one thread: nothing to choose
    with pytest.raises(ValueError, match="has no team choice"):
        task_runtime.team_choice(np.zeros(8, np.uint8))
