"""The examples run end to end, as `make demo` runs them (compiled CPU backend)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_moons_example_trains_and_writes_its_plots(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "moons.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    accuracy = float(re.search(r"Final accuracy: ([0-9.]+)", result.stdout).group(1))
    assert accuracy >= 0.97  # with PyTorch's default init, as with the seed's U(-1, 1)
    assert "on backend 'cpu'" in result.stdout
    for name in ("training_progress.png", "decision_boundary.png"):
        assert (tmp_path / "output" / name).stat().st_size > 1000


def test_digits_example_reaches_95_percent_on_held_out_digits(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "digits.py")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    accuracy = float(re.search(r"Test accuracy: ([0-9.]+) \(360 held-out digits\)", result.stdout).group(1))
    assert accuracy >= 0.95
    assert "on backend 'cpu'" in result.stdout
    for name in ("digits_training.png", "digits_confusion.png"):
        assert (tmp_path / "output" / name).stat().st_size > 1000


def test_data_parallel_moons_example_runs_on_two_ranks(tmp_path):
    """examples/moons_dp.py under mpiexec -n 2 (a few epochs): both ranks end with the same weights."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    result = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(ROOT / "examples" / "moons_dp.py"),
                             "--epochs", "20"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 ranks trained" in result.stdout
    assert "largest parameter difference between ranks: 0\n" in result.stdout
    for name in ("training_progress_dp.png", "decision_boundary_dp.png"):
        assert (tmp_path / "output" / name).stat().st_size > 1000


def test_char_gpt_example_learns_below_the_unigram_entropy(tmp_path):
    """examples/char_gpt.py for a short run: the validation loss falls well below the corpus's
    unigram entropy, the loss plot is written and text is sampled."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "char_gpt.py"), "100"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    entropy = float(re.search(r"Unigram entropy of the corpus: ([0-9.]+)", result.stdout).group(1))
    val = float(re.search(r"Validation loss: ([0-9.]+)", result.stdout).group(1))
    assert val < entropy - 0.5
    assert "Sample:\nThe " in result.stdout
    assert (tmp_path / "output" / "char_gpt_loss.png").stat().st_size > 1000
def test_digits_cnn_example_smoke_run_learns_and_writes_its_plots(tmp_path):
    """One epoch (the full run, 20 epochs with early stopping, reaches >= 0.98 held out)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "1"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    accuracy = float(re.search(r"Test accuracy: ([0-9.]+) \(360 held-out digits\)", result.stdout).group(1))
    assert accuracy >= 0.9
    assert "on backend 'cpu'" in result.stdout
    for name in ("digits_cnn_training.png", "digits_cnn_confusion.png", "digits_cnn_filters.png"):
        assert (tmp_path / "output" / name).stat().st_size > 1000


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "examples").glob("*.py")))
def test_every_example_answers_help_without_training(script, tmp_path):
    """``--help`` was a ValueError traceback (char_gpt, digits, digits_cnn) or trained for half a
    minute (moons)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: "), result.stderr[-2000:]
    assert not (tmp_path / "output").exists()
