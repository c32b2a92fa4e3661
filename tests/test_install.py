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
