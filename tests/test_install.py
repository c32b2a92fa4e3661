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
