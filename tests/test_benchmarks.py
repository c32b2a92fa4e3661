"""Smoke runs of every script in benchmarks/ on tiny shapes and budgets: each must run to the
end and write what it says. Their figures are not checked (speed is measured, not tested)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).parent / "mpiexec"
needs_mpi = pytest.mark.skipif(not MPIEXEC.exists(), reason="the dist extra (mpiexec) is not installed")
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA) is not on PATH")


def run(script: str, *args: str, timeout: float = 900) -> str:
    """stdout of ``benchmarks/<script> args``; a failure shows its stderr."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=timeout)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_step_time(tmp_path):
    out = run("step_time.py", "--smoke", "--json", str(tmp_path / "step_time.json"))
    results = json.loads((tmp_path / "step_time.json").read_text())
    assert set(results["workloads"]["moons"]["median_s"]) >= {"compiled cpu", "reference (numpy interpreter)",
                                                            "hand-written numpy"}
    assert "mlir-nn (tiered)" in results["moons_first_step_fresh_process_s"]
    assert {"codegen", "passes", "llvm", "egglog"} <= set(results["moons_compile_cold_s"]["stages"])
    assert "cold compile per stage" in out


@pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import jax"], capture_output=True).returncode != 0,
                    reason="compile_time.py compares against JAX (the bench extra)")
def test_compile_time(tmp_path):
    out = run("compile_time.py", "--smoke", "--json", str(tmp_path / "compile_time.json"))
    results = json.loads((tmp_path / "compile_time.json").read_text())
    (row,) = results["first_calls"]
    assert row["mlir_nn_s"] > 0 and row["jax_s"] > 0 and {"imports", "other"} <= row["stages_s"].keys()
    assert row["mlir_nn_with_imports_s"] > row["mlir_nn_s"] and row["jax_with_imports_s"] > row["jax_s"]
    assert row["with_imports_ratio"] > 0
    assert results["geomean_with_imports_ratio"] == pytest.approx(row["with_imports_ratio"])
    assert row["first_tier"] == "numpy" and row["mlir_nn_optimized_s"] > row["mlir_nn_s"]  # the default tier
    assert "mlir-nn" in results["time_to_train"]["wall_s"] and "geomean" in out
    assert set(results["time_to_train"]["mlir_nn_last_tier"].split("/")) <= {"numpy", "cpu"}


def test_egraph_moons():
    assert "optimize time" in run("egraph_moons.py", "1")


def test_classification_step(tmp_path):
    run("classification_step.py", "--batch", "7", "--rounds", "1", "--reps", "2", "--json", str(tmp_path / "c.json"))
    assert json.loads((tmp_path / "c.json").read_text())


def test_gpt_step(tmp_path):
    out = run("gpt_step.py", "--config", "tiny", "--batch", "2", "--rounds", "1", "--burst", "1",
              "--no-torch-compile", "--json", str(tmp_path / "gpt.json"))
    assert "cpu" in json.loads((tmp_path / "gpt.json").read_text())["median_s"]
    assert "x torch eager" in out


def test_matmul_table():
    assert "dW L2" in run("matmul_table.py", "--quick", "--only", "dW L2")


@needs_mpi
def test_data_parallel(tmp_path):
    run("data_parallel.py", "--sizes", "2,8,1", "--batch", "8", "--rounds", "1", "--steps", "2",
        "--json", str(tmp_path / "dp.json"))
    assert json.loads((tmp_path / "dp.json").read_text())["global_batch"] == 8


@needs_mpi
def test_allreduce_lowering():
    assert "median" in run("allreduce_lowering.py", "--reps", "2")


@needs_ptxas
def test_gpu_artifacts_and_their_dry_check(tmp_path):
    run("make_gpu_artifacts.py", str(tmp_path / "artifacts"), "--cases", "op_mse")
    run("gpu_check.py", str(tmp_path / "results"), "--artifacts", str(tmp_path / "artifacts"), "--cases", "op_mse",
        "--dry-run")


def test_egraph_moons_help():
    assert "runs" in run("egraph_moons.py", "--help")


def test_cnn_step(tmp_path):
    out = run("cnn_step.py", "--smoke", "--json", str(tmp_path / "cnn.json"))
    results = json.loads((tmp_path / "cnn.json").read_text())
    assert set(results["points"]["lenet5 b4"]["median_s"]) == {"mlir-nn cpu", "torch eager"}
    assert "of peak" in out


def test_shared_conv_bias(monkeypatch):
    monkeypatch.setenv("MLIR_NN_NUM_THREADS", "1")
    out = run("shared_conv_bias.py", "--smoke")
    assert "form cost" in out and "element-wise cost" in out


def test_grid(tmp_path):
    out = run("grid.py", "--smoke", "--json", str(tmp_path / "grid.json"))
    results = json.loads((tmp_path / "grid.json").read_text())
    (row,) = results["points"].values()
    assert {"compiled cpu", "numpy"} <= set(row["median_s"]) and "load_average_end" in results
    assert "Model name" in results["cpu"] and "wrote" in out
    # the peak measured round-robin with the point is no contender, and gives its own fraction
    assert "fma peak" not in row["median_s"] and row["fma_peak_gflops_float32"] > 0
    assert set(row["fraction_of_fma_peak"]) == set(row["fraction_of_start_peak"]) == set(row["median_s"])
    assert set(row["mean_s"]) == set(row["median_s"]) and all(t > 0 for t in row["mean_s"].values())


def test_grid_summary_by_placement():
    sys.path.insert(0, str(ROOT))
    from benchmarks.grid import summary

    rows = {"a": {"ours_over_best_peer": 0.5, "core_one_way_ns": [30.0, 40.0]},
            "b": {"ours_over_best_peer": 1.2, "core_one_way_ns": [200.0, 190.0]},
            "c": {"ours_over_best_peer": 1.1, "core_one_way_ns": [35.0, 200.0]},
            "d": {"ours_over_best_peer": 0.9, "core_one_way_ns": [None, None]}}
    for label, mean in zip(rows, (1.0, 1.02, 1.1, 1.05)):  # ours' mean time per call, median 1.0
        rows[label] |= {"median_s": {"compiled cpu": 1.0}, "mean_s": {"compiled cpu": mean}}
    s = summary(rows)
    assert s["points_over_1"] == ["b", "c"] and s["worst_point"] == "b"
    assert s["ours_mean_over_median_point"] == "c" and s["ours_mean_over_median_max"] == 1.1
    assert s["by_placement"] == {"near": {"points": 1, "over_1": []}, "far": {"points": 1, "over_1": ["b"]},
                                 "mixed": {"points": 1, "over_1": ["c"]}, "one core": {"points": 1, "over_1": []}}


def test_grid_held_out_points_are_not_in_the_grid():
    sys.path.insert(0, str(ROOT))
    from benchmarks.grid import GRID, HELD_OUT

    assert len(HELD_OUT) >= 10 and not set(HELD_OUT) & set(GRID)
    assert {p.optimizer for p in HELD_OUT} == {"sgd", "adam"} and {p.dtype for p in HELD_OUT} == {"float32", "float64"}


def test_egraph_depth():
    out = run("egraph_depth.py", "--quick")
    assert "ms/layer" in out and " 40 " in out and "saturated" in out


def test_kernel_times():
    out = run("kernel_times.py", "--sizes", "3-5-2", "--batch", "7", "--seconds", "0.2", "--top", "3", "--twice")
    assert "steps," in out and "first to last tick" in out
    assert len([line for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()]) == 3


def test_kernel_times_instruments_each_kernel_call():
    sys.path.insert(0, str(ROOT))
    from benchmarks.kernel_times import instrument

    step = ("func.func @step() {\n  call @ka_d() : () -> ()\n  func.call @kb_d(%0) : (index) -> ()\n"
            "  call @other() : () -> ()\n}")
    text, order = instrument(step, {"ka", "kb"})
    assert order == ["ka", "kb"]
    assert text.count("@mlirnn_tick()") == 5 and text.splitlines()[0] == "func.func private @mlirnn_tick()"
    text, order = instrument(step, {"kb"}, twice=True)
    assert order == ["kb", "kb-again"] and text.count("call @kb_d(%0)") == 2 and text.count("@mlirnn_tick()") == 5


def test_kernel_times_names_the_buffers_of_each_kernel():
    sys.path.insert(0, str(ROOT))
    from benchmarks.kernel_times import buffers

    step = ("    func.call @kp_d(%1, %2, %3) : (index, memref<?x12x784xf32, strided<[9408, 784, 1]>>, "
            "memref<32x784x32xf32>) -> ()\n  call @kq_d(%4, %5) : (memref<f32>, memref<1024xf64>) -> ()\n"
            "  call @kp_d(%6, %7, %8) : (index, memref<?x1x1xf32>, memref<1x1x1xf32>) -> ()")
    assert buffers(step, {"kp", "kq"}) == {"kp": "?x12x784 32x784x32", "kq": "scalar 1024"}
