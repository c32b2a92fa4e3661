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


def test_cnn_steps_are_in_the_payload_and_gpu_check_binds_them_without_mlir(tmp_path):
    """LeNet-5 and VGG-small training steps: built here, bound by gpu_check.py's dry run at both batch
    sizes of each case (every parameter updated), their convolution and pooling kernels in the model."""
    art, res = tmp_path / "artifacts", tmp_path / "results"
    cnn_cases = ["lenet_step", "vgg_step"]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_gpu_artifacts.py"), str(art),
                           "--arch", "sm_80", "--no-trainer", "--cases", *cnn_cases], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    built = json.loads((art / "cases.json").read_text())["cases"]
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(ROOT / "benchmarks" / "gpu_check.py"), str(res),
                           "--artifacts", str(art), "--cases", *cnn_cases, "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((res / "gpu_check.json").read_text())["cases"]
    for name, layers, batches in (("lenet_step", 5, ["64", "5"]), ("vgg_step", 4, ["128", "3"])):
        case = report[name]
        assert case["ok"] and sorted(case["check"]) == sorted(batches)
        for batch in batches:
            bound = case["check"][batch]
            assert bound["outputs"] == 1 and bound["updates"] == 2 * layers  # weights and biases
            assert 0 < bound["launches"] <= built[name]["kernels"]
        if shutil.which("ptxas"):
            nodes = {n["node"] for n in case["model"]["nodes"]}
            assert {"conv2d_bias", "conv2d_input_grad", "conv2d_weight_update", "max_pool2d_grad"} <= nodes


def test_the_gpt_step_is_in_the_payload_and_gpu_check_binds_it_without_mlir(tmp_path):
    """The char GPT's training step (examples/char_gpt.py's default model, Adam, static shapes): built
    here with its NumPy reference, bound by gpu_check.py's dry run, its launches checked against the
    kernels' ABI. Every parameter is updated with its Adam state (PyTorch's: step, exp_avg, exp_avg_sq):
    two embeddings, per block two LayerNorms and four linear layers with biases, the last LayerNorm and
    the head."""
    art, res = tmp_path / "artifacts", tmp_path / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_gpu_artifacts.py"), str(art),
                           "--arch", "sm_80", "--no-trainer", "--cases", "gpt_step"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    built = json.loads((art / "cases.json").read_text())["cases"]["gpt_step"]
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(ROOT / "benchmarks" / "gpu_check.py"), str(res),
                           "--artifacts", str(art), "--cases", "gpt_step", "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    case = json.loads((res / "gpu_check.json").read_text())["cases"]["gpt_step"]
    layers = 2
    params = 2 + layers * (2 * 2 + 4 * 2) + 2 + 1
    assert case["ok"] and list(case["check"]) == ["32"]
    bound = case["check"]["32"]
    assert bound["outputs"] == 1 and bound["updates"] == 4 * params
    assert 0 < bound["launches"] <= built["kernels"]
