"""The product schedules' table of rates: stored per CPU, loaded, in the cache key (support/schedule_rates.py)."""

from __future__ import annotations

import dataclasses

import pytest

from mlir_nn.backends import cpu
from mlir_nn.ir import Graph, make_node
from mlir_nn.support import schedule_rates
from mlir_nn.support.pipelines import load_pipeline
from mlir_nn.support.schedule_rates import DEFAULT, ScheduleRates, active, store, stored, table_path, use_rates

MEASURED = dataclasses.replace(DEFAULT, blocked=31.5, task_ns=12345.0, small_rows=(10.0, 20.0, 30.0),
                               source="measured")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    yield tmp_path
    schedule_rates._loaded.clear()


def test_a_stored_table_round_trips_and_becomes_the_active_one(cache):
    assert stored() is None and active() == DEFAULT
    path = store(MEASURED)
    assert path == table_path() and path.is_relative_to(cache)
    assert stored() == MEASURED and active() == MEASURED
    with use_rates(DEFAULT):
        assert active() == DEFAULT
    assert active() == MEASURED


def test_a_table_that_does_not_read_is_ignored(cache):
    store(MEASURED)
    table_path().write_text('{"blocked": 1.0}')
    schedule_rates._loaded.clear()
    assert stored() is None and active() == DEFAULT


def test_a_table_with_a_rate_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="positive"):
        ScheduleRates.from_json(dataclasses.replace(MEASURED, loops=0.0).to_json())
    with pytest.raises(ValueError, match="not a schedule rates table"):
        ScheduleRates.from_json("[]")


def test_the_digest_covers_the_rates_not_the_source():
    assert dataclasses.replace(DEFAULT, source="elsewhere").digest() == DEFAULT.digest()
    assert dataclasses.replace(DEFAULT, task_ns=DEFAULT.task_ns + 1).digest() != DEFAULT.digest()


def test_the_table_is_part_of_the_compiled_steps_cache_key():
    x = make_node("input", [], name="x", shape=("N", 3), dtype="float32")
    graph = Graph((x,), (), (make_node("relu", [x]),), name="relu")
    pipeline = load_pipeline("cpu")
    key = cpu._key(graph, pipeline, True, 2)
    with use_rates(MEASURED):
        assert cpu._key(graph, pipeline, True, 2) != key
    with use_rates(dataclasses.replace(DEFAULT)):
        assert cpu._key(graph, pipeline, True, 2) == key
