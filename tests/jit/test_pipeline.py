"""The compile pipeline under interruption: a Ctrl-C at any point of a cold compile (egglog
and MLIR loading included) leaves the process able to compile again."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (files, Nth Python call in them): points inside egglog's and the rules' loading, MLIR's
# dialect registration and linalg's op definitions, and the LLVM execution engine's import
POINTS = [("/egglog/", 3000), ("mlir_nn/egraph/rules/", 200), ("/mlir/", 40), ("/mlir/", 400), ("/mlir/", 5000)]


def test_a_ctrl_c_anywhere_in_a_cold_compile_leaves_the_process_able_to_compile(tmp_path):
    children = []
    for i, (key, nth) in enumerate(POINTS):
        env = dict(os.environ, PYTHONPATH=str(ROOT), MLIR_NN_CACHE_DIR=str(tmp_path / f"cache{i}"))
        children.append(subprocess.Popen([sys.executable, "-m", "tests.jit.interrupted_compile", key, str(nth)],
                                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True))
    outcomes = []
    for (key, nth), child in zip(POINTS, children):
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, f"interrupted at call {nth} in {key}: rc {child.returncode}\n{err[-3000:]}"
        outcome, loss = out.split()
        assert float(loss) >= 0
        outcomes.append(outcome)
    assert outcomes.count("interrupted") >= len(POINTS) - 1, outcomes  # the points do land in the compile
