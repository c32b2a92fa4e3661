"""Data parallelism under ``mpiexec -n 2`` (the MPICH launcher from the ``dist`` extra).

Each test runs tests/distributed/mpi_worker.py on two ranks in a subprocess bounded in time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("mpi_worker.py")
MPIEXEC = Path(sys.executable).parent / "mpiexec"
LIMIT = 240  # seconds for one two-rank run (compiles included); a hang fails the test


def run_two_ranks(*args: str, limit: float = LIMIT) -> subprocess.CompletedProcess:
    assert MPIEXEC.exists(), f"{MPIEXEC} is missing: install the dist extra (pip install -e '.[dev,dist]')"
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(WORKER), *args], capture_output=True,
                          text=True, timeout=limit, env=env)


@pytest.mark.parametrize("backend", ["cpu", "numpy"])
def test_two_ranks_match_a_single_process(backend):
    """SGD with momentum and Adam on half batches per rank == one process on whole batches
    (1e-5, float32); ranks agree with each other and after the broadcast; the distributed
    Trainer reproduces the single-process Trainer."""
    result = run_two_ranks("acceptance", backend)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK acceptance rank 0" in result.stdout and "OK acceptance rank 1" in result.stdout


def test_ranks_with_different_steps_fail_at_the_first_step():
    result = run_two_ranks("mismatch", limit=120)
    assert result.returncode != 0
    assert "ranks [1] traced a different step than rank 0" in result.stderr


def test_ranks_with_different_data_refuse_at_the_start_of_train():
    result = run_two_ranks("uneven", limit=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK uneven rank 0" in result.stdout and "OK uneven rank 1" in result.stdout


@pytest.mark.parametrize("how", ["hangs", "dies", "raises"])
def test_a_missing_rank_ends_the_job_with_an_error(how, tmp_path):
    """Rank 1 stops taking part (stuck in a sleep, exits, or raises): the job ends with an
    error well before the subprocess limit instead of hanging; a raising rank ends it at
    once, long before rank 0's 60 s timeout."""
    report = tmp_path / "rank0-error.txt"
    start = time.monotonic()
    result = run_two_ranks(how, str(report), limit=120)
    assert result.returncode != 0, result.stdout + result.stderr
    if how == "raises":
        assert time.monotonic() - start < 40
    assert "OK" not in result.stdout
    if how == "hangs":  # rank 0 gave up after init(timeout=3.0); a dead rank is ended by mpiexec itself
        assert "rank 0 of 2 waited 3 s for the other ranks" in report.read_text()
