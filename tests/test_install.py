"""The compiler dependencies are really installed and usable (no mocks)."""


def test_mlir_bindings_parse_and_jit():
    import ctypes

    import mlir.execution_engine
    import mlir.ir
    import mlir.passmanager

    with mlir.ir.Context():
        module = mlir.ir.Module.parse(
            "func.func @add(%a: i64, %b: i64) -> i64 attributes {llvm.emit_c_interface} {\n"
            "  %c = arith.addi %a, %b : i64\n  return %c : i64\n}"
        )
        mlir.passmanager.PassManager.parse(
            "builtin.module(convert-arith-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts)"
        ).run(module.operation)
        engine = mlir.execution_engine.ExecutionEngine(module, opt_level=2)
        a, b, res = ctypes.c_int64(40), ctypes.c_int64(2), ctypes.c_int64(0)
        engine.invoke("add", ctypes.pointer(a), ctypes.pointer(b), ctypes.pointer(res))
        assert res.value == 42


def test_egglog_saturates():
    from egglog import EGraph, Expr, i64Like, rewrite, ruleset

    class Num(Expr):
        def __init__(self, value: i64Like) -> None: ...

        def __add__(self, other: "Num") -> "Num": ...

    rules = ruleset(rewrite(Num(0) + Num(1)).to(Num(1)))
    egraph = EGraph()
    expr = egraph.let("e", Num(0) + Num(1))
    egraph.run(rules.saturate())
    egraph.check(expr == Num(1))


def test_the_wheel_ships_every_package_and_the_pass_files():
    """pyproject lists packages explicitly (passes/ is mapped to mlir_nn.passes): none may be missed."""
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(root).parts) for p in (root / "mlir_nn").rglob("__init__.py")}
    assert on_disk | {"mlir_nn.passes"} == set(config["packages"])
    assert config["package-dir"] == {"mlir_nn.passes": "passes"}
    patterns = config["package-data"]["mlir_nn.passes"]
    pass_files = [p.name for p in (root / "passes").iterdir() if p.is_file()]
    assert pass_files and all(any(fnmatch(name, pat) for pat in patterns) for name in pass_files)
    data = [p for p in (root / "mlir_nn").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    for path in data:  # files the package reads at run time (the thin call's C source)
        package = ".".join(path.parent.relative_to(root).parts)
        assert any(fnmatch(path.name, pat) for pat in config["package-data"].get(package, [])), path


def test_pass_files_are_found_in_the_installed_layout(tmp_path):
    """Installed, passes/ lies at mlir_nn/passes (not beside the package): every module that
    reads a shipped pass or schedule file must find it there."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "mlir_nn", tmp_path / "mlir_nn", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "passes", tmp_path / "mlir_nn" / "passes")
    probe = (
        "from mlir_nn.gpu import pipeline, schedule\n"
        "from mlir_nn.support.pipelines import load_pipeline, shipped_dir\n"
        "from mlir_nn.codegen.cpu_matmul import _schedule_text\n"
        "assert shipped_dir().parent.parent.samefile('.'), shipped_dir()\n"
        "assert pipeline.read_sections()['device']\n"
        "assert 'transform' in schedule.SCHEDULE_FILE.read_text()\n"
        "assert load_pipeline('cpu').passes and _schedule_text(4)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
