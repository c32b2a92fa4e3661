"""The host's LLVM target and the attributes compiled functions carry (real LLVM tools and JIT)."""

import subprocess
from pathlib import Path

import pytest
from mlir import ir
from mlir.passmanager import PassManager

from mlir_nn.backends.host_cpu import PREFERENCES, host_target, target_features, tune_for_host
from mlir_nn.backends.native import compile_object, llvm_tool

pytestmark = pytest.mark.skipif(host_target() is None, reason="LLVM's opt does not report the host CPU")

# An im2col copy: its innermost loops are strided on both sides (the shape of a VGG layer's).
_IM2COL = """
func.func @im2col(%a: memref<8x64x20x20xf32>, %b: memref<8x16x16x64x3x3xf32>) attributes {llvm.emit_c_interface} {
  linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d3, d1 + d4 + 1, d2 + d5 + 1)>,
                                   affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d3, d4, d5)>],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%a : memref<8x64x20x20xf32>) outs(%b : memref<8x16x16x64x3x3xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  }
  return
}
llvm.func @declared(i64)
"""
_TO_LLVM = ("builtin.module(convert-linalg-to-loops, lower-affine, convert-scf-to-cf, expand-strided-metadata, "
            "finalize-memref-to-llvm, convert-to-llvm, reconcile-unrealized-casts)")


def test_the_host_target_is_llvms_view_of_this_cpu():
    cpu, features = host_target()
    assert cpu and cpu != "generic"
    assert features and all(f[:1] in ("+", "-") for f in features)
    tuned = target_features()
    assert tuned[-len(PREFERENCES):] == PREFERENCES
    assert set(tuned) - set(PREFERENCES) <= set(features)
    assert not any(f[1:] == p[1:] and f != p for f in tuned for p in PREFERENCES)


def _lowered(context: ir.Context, tuned: bool) -> ir.Module:
    module = ir.Module.parse(_IM2COL, context)
    PassManager.parse(_TO_LLVM, context).run(module.operation)
    if tuned:
        tune_for_host(module)
    return module


def test_defined_functions_get_the_host_cpu_and_features_declarations_do_not():
    with ir.Context() as context:
        module = _lowered(context, tuned=True)
        functions = {str(ir.StringAttr(op.attributes["sym_name"])).strip('"'): op
                     for op in [op.operation for op in module.body.operations] if op.name == "llvm.func"}
        assert "target_features" in functions["im2col"].attributes
        assert str(functions["im2col"].attributes["target_cpu"]).strip('"') == host_target()[0]
        assert "prefer-no-gather" in str(functions["_mlir_ciface_im2col"].attributes["target_features"])
        assert "target_features" not in functions["declared"].attributes


@pytest.mark.skipif(llvm_tool("llvm-objdump") is None, reason="no llvm-objdump to read the machine code")
@pytest.mark.parametrize("tuned", [False, True])
def test_a_strided_copy_compiles_without_gathers_or_scatters(tuned, tmp_path: Path):
    """Untuned, LLVM vectorizes this copy into AVX-512 gathers and scatters on hosts whose CPU model
    it gives fast gathers (AMD Zen 4 and 5; slower than scalar code there); tuned, never. (An Intel
    Xeon, family 6 model 207, gets none untuned: LLVM prefers no gathers on those models already.)"""
    with ir.Context() as context:
        module = _lowered(context, tuned)
        compile_object(module, "_mlir_ciface_im2col", tmp_path / "im2col.o")
    code = subprocess.run([llvm_tool("llvm-objdump"), "-d", str(tmp_path / "im2col.o")],
                          capture_output=True, text=True, check=True).stdout
    vector_memory = code.count("gather") + code.count("scatter")
    if tuned:
        assert vector_memory == 0
    elif "+avx512f" not in host_target()[1]:
        pytest.skip("without AVX-512 LLVM has no scatters to choose")
    elif vector_memory == 0:
        pytest.skip(f"LLVM chooses no gathers or scatters for {host_target()[0]} untuned: nothing for the "
                    "preferences to remove on this host")


@pytest.mark.parametrize("opt_level", [0, 2])
def test_only_code_compiled_with_ir_passes_is_tuned(opt_level):
    """At -O0 (the quick tier) no loop vectorizes, so the JIT's own host target serves and the
    compile does not wait for the host's probe: its functions carry no target attributes."""
    from mlir_nn.backends.cpu import compile_kernel, serial_pipeline
    from mlir_nn.ir import Graph, make_node
    from mlir_nn.support.pipelines import load_pipeline

    x = make_node("input", [], name="x", shape=("N", 5), dtype="float32")
    graph = Graph((x,), (), (make_node("relu", [x]),), name="tuned")
    kernel = compile_kernel(graph, serial_pipeline(load_pipeline("cpu")), use_disk=False, opt_level=opt_level,
                            workers=False)
    assert ("target_cpu" in kernel.stages["llvm"]) == (opt_level > 0)
