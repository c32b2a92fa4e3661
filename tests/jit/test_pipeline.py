"""The compile pipeline under interruption: a Ctrl-C at any point of a cold compile (egglog
and MLIR loading included) leaves the process able to compile again."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (files, Nth Python call in them): points inside egglog's and the rules' loading, MLIR's
# dialect registration and the building of the step's ops (a cold compile makes about 3900
# calls in MLIR's Python files: the linalg op DSL, 17000 more, is not loaded; loading the
# rules an MLP needs makes about 115 calls in their files)
POINTS = [("/egglog/", 3000), ("mlir_nn/egraph/rules/", 60), ("/mlir/", 40), ("/mlir/", 400), ("/mlir/", 3000)]


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
    assert outcomes == ["interrupted"] * len(POINTS), outcomes  # every point lands inside the compile


_OBSERVED_BUILD = """
import numpy as np
import mlir_nn
from mlir_nn.backends import task_runtime, thin_call
from mlir_nn.jit import pipeline
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step

optimized = pipeline.StepPipeline.optimized
seen = []

def observed(self, graph, batch_estimate):
    seen.append((task_runtime.BUILD.building(), thin_call.BUILD.building()))
    return optimized(self, graph, batch_estimate)

pipeline.StepPipeline.optimized = observed
model = MLP(3, [4, 1])
step = mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1), mse_loss))
loss = step(np.ones((5, 3), np.float32), np.ones((5, 1), np.float32))
print(seen, float(loss))
"""


def test_a_cold_cpu_build_starts_its_c_builds_before_the_optimizer(tmp_path):
    """cc builds the call extension and the task runtime while egglog and the lowering run,
    not from the lowering on (the task runtime's build kept small steps' LLVM stage waiting)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLIR_NN_CACHE_DIR=str(tmp_path), MLIR_NN_TIERED="0")
    done = subprocess.run([sys.executable, "-c", _OBSERVED_BUILD], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen, loss = done.stdout.rsplit(" ", 1)
    assert seen == "[(True, True)]" and float(loss) >= 0
