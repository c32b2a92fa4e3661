"""One gpu.module per step: one PTX text (ptxas accepts it as is), one cubin, readable kernel names."""

import re
import subprocess
import sys

import pytest

from tests.gpu.conftest import PTXAS


def test_mini_step_is_one_module_with_numbered_kernels(mini_program):
    for arch in ("sm_80", "sm_90"):
        assert list(mini_program.ptx[arch]) == ["mini_kernels"] == list(mini_program.cubin[arch])
    entries = re.findall(r"\.entry\s+(\w+)", mini_program.ptx["sm_90"]["mini_kernels"])
    assert len(entries) == mini_program.kernel_count == len(set(entries))
    assert all(re.fullmatch(rf"mini_k{i:02d}_[a-z0-9_]+", e) for i, e in enumerate(entries)), entries
    launched = [r["kernel"] for r in mini_program.plan["program"] if r["op"] == "gpu.launch_func"]
    assert launched == entries


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found (CUDA toolkit not installed)")
def test_emitted_ptx_goes_through_ptxas_as_is(tmp_path):
    ptx = tmp_path / "step.ptx"
    proc = subprocess.run([sys.executable, "-m", "mlir_nn.cli", "compile", "--mlp", "2,32,32,16,1", "--target",
                           "cuda", "--arch", "sm_90", "--emit", "ptx", "-o", str(ptx)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    names = re.findall(r"\.entry\s+(\w+)", ptx.read_text())
    # kernels are named after the Graph op they compute, in launch order
    # (products over the batch as two kernels, one per tiling: the host launches one)
    assert names[:5] == ["step_k00_linear_tile128", "step_k01_linear_tile64", "step_k02_linear_tile128",
                         "step_k03_linear_tile64", "step_k04_linear_tile128"]
    assert "step_k12_matmul_relu_grad_tile128" in names and "step_k18_gemm_tile64" in names
    proc = subprocess.run([PTXAS, "-arch=sm_90", str(ptx), "-o", str(tmp_path / "step.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_products_contract_to_fma(mini_program):
    """fastmath<contract> on the kernels' float ops: each product feeding a sum is one fma.rn.f32."""
    ptx = mini_program.ptx["sm_90"]["mini_kernels"]
    bodies = dict(re.findall(r"\.entry\s+(\w+)(.*?)(?=\.entry|\Z)", ptx, re.S))
    products = [name for name in bodies if re.search(r"_matmul_tile\d+$", name)]
    assert len(products) == 3
    for name in products:
        assert "fma.rn.f32" in bodies[name] and "mul.rn.f32" not in bodies[name], name


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found (CUDA toolkit not installed)")
def test_large_step_products_are_register_tiled(tmp_path):
    """>= 4 FMAs per shared-memory load instruction, no spills, at least 2 resident blocks per SM."""
    from mlir_nn.runtime.perf_model import occupancy, ptx_bodies, ptxas_resources

    ptx = tmp_path / "step.ptx"
    proc = subprocess.run([sys.executable, "-m", "mlir_nn.cli", "compile", "--mlp", "784,1024,1024,10", "--batch",
                           "512", "--target", "cuda", "--arch", "sm_90", "--emit", "ptx", "-o", str(ptx)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = ptx.read_text()
    resources = ptxas_resources(text, "sm_90")
    products = [k for k in ptx_bodies(text) if re.search(r"_(linear|gemm|matmul_relu_grad)(_tile\d+)?$", k)]
    # 3 linear and 2 matmul_relu_grad over the batch (both tilings each), 3 gemm (weight gradients)
    assert len(products) == 13 and sum(k.endswith("_tile128") for k in products) == 5
    for kernel in products:
        res = resources[kernel]
        assert res.shared_loads and res.fma / res.shared_loads >= 4, (kernel, res)
        assert res.spill_bytes == 0 and occupancy(res, 256)[0] >= 2, (kernel, res)
