"""The hand-written reference kernels build with CMake + nvcc (no GPU needed) and pass ctest."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None or shutil.which("cmake") is None, reason="needs nvcc and cmake")
def test_cmake_builds_kernels_and_ctest_passes(tmp_path):
    env = dict(os.environ, PATH=f"{Path(NVCC).parent}:{os.environ['PATH']}")
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(tmp_path), "-DCMAKE_CUDA_ARCHITECTURES=80"],
                ["cmake", "--build", str(tmp_path), "-j2"], ["ctest", "--test-dir", str(tmp_path)]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    from mlir_nn.runtime.kernels import ReferenceKernels

    kernels = ReferenceKernels(tmp_path / "libmlirnn_kernels.so")
    assert kernels.lib.mlirnn_matmul_tiled.restype is not None
