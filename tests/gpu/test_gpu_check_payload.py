"""The GPU visit's payload: artifacts from the optimized graph, and the Trainer case's caches, that
gpu_check.py reads without MLIR or egglog."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED_RUN = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlir", "egglog"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_artifacts_are_optimized_and_gpu_check_reads_them_without_mlir(tmp_path):
    art, res = tmp_path / "artifacts", tmp_path / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_gpu_artifacts.py"), str(art),
                           "--arch", "sm_80", "--cases", "moons_step", "op_linear_relu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cases = json.loads((art / "cases.json").read_text())["cases"]
    assert cases["op_linear_relu"]["kernels"] == 2  # x @ W + b, relu: one fused kernel per tiling
    assert cases["moons_step"]["kernels"] < 40
    check = [sys.executable, "-c", BLOCKED_RUN, str(ROOT / "benchmarks" / "gpu_check.py"), str(res),
             "--artifacts", str(art), "--cases", "moons_step", "op_linear_relu"]
    proc = subprocess.run([*check, "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((res / "gpu_check.json").read_text())
    # at batch 7 the second kernel of each of the 5 reductions (loss, 4 bias gradients) is not launched,
    # nor the 128 x 128 kernels of the 7 products over the batch (4 forward, 3 input gradients)
    assert report["cases"]["moons_step"]["check"]["7"]["launches"] == cases["moons_step"]["kernels"] - 5 - 7
    if shutil.which("ptxas"):  # the roofline model, labelled as one: every launch of the batch attributed
        model = report["cases"]["op_linear_relu"]["model"]
        assert model["label"] == "roofline model, not a measurement" and model["predicted_s"] > 0
        (node,) = model["nodes"]
        assert node["node"] == "linear" and node["flops"] >= 2 * 512 * 784 * 1024 and node["spill_bytes"] == 0
        assert node["kernels"][0].endswith("_k01_linear_tile64") and node["grid_blocks"] == [8 * 16]
        assert 0 < node["occupancy"][0] <= 1 and node["fma_per_shared_load"] > 0
        moons = report["cases"]["moons_step"]["model"]["nodes"]
        assert sum(len(n["kernels"]) for n in moons) == report["cases"]["moons_step"]["check"]["10"]["launches"]
        assert "MODEL (roofline" in proc.stdout
    # the Trainer case: every step found in the carried caches (optimizer and CUDA), without egglog or MLIR
    resident = report["resident"]
    assert resident["ok"], resident
    assert [(s["step"], s["batches"]) for s in resident["steps"]] == [("step", [7, 10]), ("_predict_step", [50])]
    # without --dry-run it gets as far as the driver: no cuda-bindings (or no GPU) here
    proc = subprocess.run(check, capture_output=True, text=True)
    if proc.returncode != 0:
        assert "CudaUnavailable" in proc.stderr, proc.stderr


def test_cnn_step_artifacts_pass_gpu_checks_dry_run(tmp_path):
    """A CNN step (LeNet-5, optimized: fused conv biases and weight updates) builds into an artifact
    that gpu_check.py reads, without MLIR, and checks on its dry run. (vgg_step takes the same path
    at several times the compile time.)"""
    art, res, cases = tmp_path / "artifacts", tmp_path / "results", ["lenet_step"]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_gpu_artifacts.py"), str(art),
                           "--arch", "sm_80", "--no-trainer", "--cases", *cases], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(ROOT / "benchmarks" / "gpu_check.py"), str(res),
                           "--artifacts", str(art), "--cases", *cases, "--dry-run"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((res / "gpu_check.json").read_text())
    assert "resident" not in report  # (no Trainer case built)
    for name in cases:
        assert report["cases"][name]["ok"] and report["cases"][name]["check"], name
