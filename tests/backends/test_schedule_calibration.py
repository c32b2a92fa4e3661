"""``mlir-nn calibrate``: the product schedules' rates measured on the host (backends/schedule_calibration.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlir_nn.backends.schedule_calibration import FORCED, LARGE, TASK_ROWS, _compiled, _product
from mlir_nn.backends.task_runtime import teams_forked
from mlir_nn.cli import main
from mlir_nn.support.schedule_rates import FORMAT, ScheduleRates, stored


def test_calibrate_measures_every_rate_and_stores_nothing_unless_asked(capsys):
    """One run with the least timing budget: every rate positive, the table printed as JSON."""
    assert main(["calibrate", "--budget", "0"]) == 0
    out = capsys.readouterr().out
    table = ScheduleRates.from_json(out[out.index("{"):])
    assert table.source == "measured" and table.threads >= 1
    assert "small-rows" in out and "blocked-swapped" in out
    assert json.loads(out[out.index("{"):])["format"] == FORMAT
    assert stored() is None


def test_a_probe_that_the_table_does_not_force_is_refused():
    with pytest.raises(RuntimeError, match="planned as"):
        _compiled(_product(2, 2, 2), "blocked", threads=False)  # k too short to block: short-k
    assert set(FORCED) == {"blocked", "blocked-swapped", "loops", "small-rows"}


def test_the_hand_off_probe_queues_tasks_on_threads():
    """``task_ns`` is timed on a product small enough that the hand-off's fixed cost shows, yet
    split into tasks: a call on threads queues some, and its result is the product's."""
    executable = _compiled(_product(TASK_ROWS, LARGE, LARGE), "blocked", threads=True)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((TASK_ROWS, LARGE), (LARGE, LARGE)))
    before = teams_forked()
    (got,) = executable.run([a], [b])
    assert teams_forked() > before
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
