"""The core-to-core latency probe that grid.py records beside its timings."""

from __future__ import annotations

import math
import os

import pytest

from benchmarks.core_latency import one_way_ns


def test_one_core_has_no_latency_to_measure():
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        assert one_way_ns() is None
    finally:
        os.sched_setaffinity(0, allowed)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_cores_give_a_time_and_the_caller_keeps_its_cores():
    allowed = os.sched_getaffinity(0)
    ns = one_way_ns(rounds=500, repeats=3)
    assert ns is not None and math.isfinite(ns) and 1.0 < ns < 1e6
    assert os.sched_getaffinity(0) == allowed  # pinned for the measurement only
