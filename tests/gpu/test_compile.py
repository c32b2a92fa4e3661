"""The CUDA pipeline: linalg -> kernels -> PTX (ptxas-checked) and cubin, and the plan's ABI."""

import subprocess

import numpy as np
import pytest

from mlir_nn.gpu import compile_linalg
from mlir_nn.runtime.plan import PlanError, bind, check_launch_abi
from tests.gpu.conftest import MINI, PTXAS


def test_every_op_becomes_a_kernel(mini_program):
    assert "gpu.launch_func" in mini_program.gpu_text
    # both matmuls are fused with their zero fill: register-tiled kernels, the one with
    # static sizes (the weight gradient) one tiling, the one over the batch both
    assert mini_program.schedules == {"parallel": 4, "matmul": 3, "sequential": 1, "reduction": 4}
    assert mini_program.kernel_count == 12
    assert "workgroup(" in mini_program.gpu_text  # the matmuls stage tiles in shared memory


@pytest.mark.parametrize("arch,version", [("sm_80", "7.0"), ("sm_90", "8.0")])
def test_ptx_and_cubin_per_arch(mini_program, arch, version):
    for name, ptx in mini_program.ptx[arch].items():
        assert f".target {arch}" in ptx and f".version {version}" in ptx
        assert mini_program.cubin[arch][name][:4] == b"\x7fELF"


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found (CUDA toolkit not installed)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_accepts_the_ptx(mini_program, arch, tmp_path):
    for name, ptx in mini_program.ptx[arch].items():
        path = tmp_path / f"{name}.ptx"
        path.write_text(ptx)
        proc = subprocess.run([PTXAS, f"-arch={arch}", str(path), "-o", str(tmp_path / "out.cubin")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("batch", [1, 7, 100, 1000])
def test_plan_matches_kernel_signatures(mini_program, batch):
    bound = bind(mini_program.plan, [(batch, 4), (batch, 8), (4, 8), (8,)])
    launches = [a for a in bound.actions]
    # the loss (over batch * 8) and the bias gradient (over batch) need their second kernel
    # only once they take more than one block of 256 threads x 4 elements
    assert len(launches) == 9 + (batch * 8 > 1024) + (batch > 1024)
    for arch in ("sm_80", "sm_90"):
        for launch in launches:
            check_launch_abi(launch, mini_program.ptx[arch][launch.binary])
    assert [r.shape for r in bound.results] == [(), (4, 8), (8,)]
    # buffers are sized from the batch: every (N, 8) intermediate holds batch * 8 floats
    assert sorted(bound.allocs.values()).count(batch * 8 * 4) >= 3
    # grids cover the rows: 8-row tiles for elementwise, 64-row tiles for the matmul
    grids = [launch.grid[0] for launch in launches if launch.block == (32, 8, 1)]
    assert -(-batch // 8) in grids
    matmul = next(launch for launch in launches if launch.block == (16, 16, 1))
    assert matmul.grid[0] * 64 >= batch > (matmul.grid[0] - 1) * 64


def test_abi_check_catches_a_wrong_plan(mini_program):
    bound = bind(mini_program.plan, [(3, 4), (3, 8), (4, 8), (8,)])
    launch = bound.actions[1]
    broken = type(launch)(launch.binary, launch.kernel, launch.grid, launch.block, launch.smem, launch.params[:-1])
    with pytest.raises(PlanError, match="PTX declares"):
        check_launch_abi(broken, mini_program.ptx["sm_90"][launch.binary])
    wrong_block = type(launch)(launch.binary, launch.kernel, launch.grid, (8, 8, 1), launch.smem, launch.params)
    with pytest.raises(PlanError, match="built for"):
        check_launch_abi(wrong_block, mini_program.ptx["sm_90"][launch.binary])


def test_bind_rejects_wrong_shapes(mini_program):
    with pytest.raises(PlanError, match="expected 4 arguments"):
        bind(mini_program.plan, [(3, 4)])
    with pytest.raises(PlanError, match=r"has shape \(3, 5\)"):
        bind(mini_program.plan, [(3, 5), (3, 8), (4, 8), (8,)])


def test_host_scalars_are_computed_like_the_device_would():
    """A float the host computes from the batch (1 / numel) reaches the kernel as f32."""
    program = compile_linalg(MINI, "mini", archs=(), cubin=False)
    bound = bind(program.plan, [(5, 4), (5, 8), (4, 8), (8,)])
    floats = {v for a in bound.actions for k, v in a.params if k == "f32"}
    assert floats == {np.float32(40.0)}


def test_unknown_arch_is_rejected():
    from mlir_nn.gpu.compiler import device_binaries

    with pytest.raises(ValueError, match="unknown arch 'sm_12'"):
        device_binaries("module {}", "sm_12", "isa")
