"""Real training steps (traced Graph -> shared codegen -> CUDA): moons and the large MLP."""

import subprocess
import sys

import pytest

from mlir_nn.runtime.artifact import Artifact
from mlir_nn.runtime.plan import bind, check_launch_abi
from tests.gpu.conftest import PTXAS

pytest.importorskip("mlir_nn.codegen", reason="the tensor-level codegen (mlir_nn.codegen) is not merged yet")

STEPS = {"moons": ("2,32,32,16,1", 10), "large_mlp": ("784,1024,1024,10", 512)}


def traced(mlp: str, batch: int, optimized: bool = False, extra: tuple[str, ...] = ()):
    from mlir_nn.cli import build_parser, build_step
    from mlir_nn.egraph import optimize
    from mlir_nn.jit import trace_step

    args = build_parser().parse_args(["compile", "--mlp", mlp, "--batch", str(batch), *extra])
    step, x, y = build_step(args)
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    return optimize(graph, batch_estimate=batch)[0] if optimized else graph


@pytest.mark.parametrize("optimized", [False, True], ids=["traced", "optimized"])
@pytest.mark.parametrize("name", list(STEPS))
def test_step_compiles_for_sm80_and_sm90(name, optimized, tmp_path):
    from mlir_nn.backends.cuda import compile_graph

    graph = traced(*STEPS[name], optimized=optimized)
    program = compile_graph(graph, ("sm_80", "sm_90"))
    # every matmul-based node is one fused kernel (fill + matmul + epilogue), none left on its own;
    # one per tiling (128 x 128, 64 x 64) when its rows are the batch
    nodes = [n for n in graph.nodes if n.op in ("matmul", "linear", "gemm", "matmul_relu_grad")]
    over_batch = sum("N" in n.shape for n in nodes)
    assert program.schedules["matmul"] == len(nodes) + over_batch and "contraction" not in program.schedules
    batch = STEPS[name][1]
    shapes = [tuple(batch if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
    bound = bind(program.plan, shapes)
    if optimized:
        epilogues = sum(n.op in ("linear", "gemm", "matmul_relu_grad") for n in graph.nodes)
        launched = sum(hasattr(a, "kernel") for a in bound.actions)
        assert epilogues == len(nodes) and launched <= {"moons": 31, "large_mlp": 24}[name]
    assert [r.shape for r in bound.results][len(graph.outputs):] == [tuple(n.shape) for _, n in graph.updates]
    for arch in ("sm_80", "sm_90"):
        assert set(program.cubin[arch]) == set(program.ptx[arch])
        for launch in bound.actions:
            check_launch_abi(launch, program.ptx[arch][launch.binary])
    if PTXAS:
        for arch in ("sm_80", "sm_90"):
            ptx = tmp_path / f"{arch}.ptx"
            ptx.write_text(next(iter(program.ptx[arch].values())))
            proc = subprocess.run([PTXAS, f"-arch={arch}", str(ptx), "-o", str(tmp_path / "k.cubin")],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr


def test_cli_writes_the_artifact(tmp_path):
    out = tmp_path / "step.mlirnn"
    proc = subprocess.run([sys.executable, "-m", "mlir_nn.cli", "compile", "--mlp", "2,8,1", "--target", "cuda",
                           "--arch", "sm_80", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    artifact = Artifact.read(out)
    assert artifact.arch == "sm_80" and len(artifact.signature["updates"]) == 4
    assert artifact.graph_fingerprint == traced("2,8,1", 100, optimized=True).fingerprint()
    proc = subprocess.run([sys.executable, "-m", "mlir_nn.cli", "compile", "--mlp", "2,8,1", "--emit", "cubin"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "give -o" in proc.stderr
