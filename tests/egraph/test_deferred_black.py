"""Optimizing a step imports egglog but not black; egglog still prints with black, and a later
``import black`` gets black."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from egglog import i64

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
import json, sys
import numpy as np
from mlir_nn.egraph.cache import optimize_cached
from mlir_nn.jit import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step
model = MLP(3, [5, 2])
step = jit(train_step(model, SGD(model.parameters(), lr=0.1)), backend="numpy", optimize=False)
step(np.ones((4, 3), np.float32), np.ones((4, 2), np.float32))
optimized, report = optimize_cached(step._last.graph, 4)
after_optimizing = sorted(m for m in ("black", "egglog") if m in sys.modules)
from egglog import i64
total = i64(0)
for k in range(30):
    total = total + i64(k) * i64(k + 1000)
printed = str(total)
import black
print(json.dumps({"loaded": after_optimizing, "error": report.error, "printed": printed,
                  "mode": f"{black.Mode.__module__}.{black.Mode.__name__}"}))
"""


def test_optimizing_leaves_black_unloaded_until_egglog_prints(tmp_path):
    env = dict(os.environ, MLIR_NN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["loaded"] == ["egglog"] and report["error"] is None
    # printed as in this process, where egglog imported black itself (black wraps the long line)
    total = i64(0)
    for k in range(30):
        total = total + i64(k) * i64(k + 1000)
    assert report["printed"] == str(total)
    assert "\n" in report["printed"] and report["mode"] == "black.mode.Mode"
