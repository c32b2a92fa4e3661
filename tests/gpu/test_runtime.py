"""Artifact round trip, the runtime without MLIR/egglog, and clear errors without a GPU."""

import io
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from mlir_nn.runtime.artifact import Artifact, ArtifactError
from tests.gpu.device import has_gpu, needs_gpu

SIGNATURE = {
    "name": "mini",
    "inputs": [{"name": "x", "shape": ["N", 4], "dtype": "float32"},
               {"name": "y", "shape": ["N", 8], "dtype": "float32"}],
    "params": [{"name": "W", "shape": [4, 8], "dtype": "float32"}, {"name": "b", "shape": [8], "dtype": "float32"}],
    "outputs": [{"shape": [], "dtype": "float32"}],
    "updates": ["W", "b"],
}


@pytest.fixture(scope="module")
def artifact(mini_program):
    return Artifact("sm_90", "f" * 64, SIGNATURE, mini_program.plan, mini_program.cubin["sm_90"],
                    mini_program.ptx["sm_90"], "0.1.0", {"kernels": mini_program.kernel_count})


def test_artifact_round_trip(artifact, tmp_path):
    path = tmp_path / "mini.mlirnn"
    artifact.write(path)
    back = Artifact.read(path)
    assert back.plan == artifact.plan and back.signature == SIGNATURE
    assert back.cubins == artifact.cubins and back.ptx == artifact.ptx
    assert (back.arch, back.graph_fingerprint, back.package_version) == ("sm_90", "f" * 64, "0.1.0")


def test_damaged_artifacts_are_refused(artifact, tmp_path):
    data = artifact.to_bytes()
    with pytest.raises(ArtifactError, match="not an mlir-nn CUDA artifact"):
        Artifact.from_bytes(data[: len(data) // 2])
    path = tmp_path / "edited.mlirnn"
    with zipfile.ZipFile(path, "w") as z, zipfile.ZipFile(io.BytesIO(data)) as src:
        for item in src.namelist():
            blob = src.read(item)
            z.writestr(item, blob[:100] + bytes([blob[100] ^ 0xFF]) + blob[101:] if item.endswith(".cubin") else blob)
    with pytest.raises(ArtifactError, match="damaged"):
        Artifact.read(path)
    with pytest.raises(ArtifactError, match="cannot read"):
        Artifact.read(tmp_path / "missing.mlirnn")


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlir", "egglog"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
import mlir_nn.runtime.cuda, mlir_nn.runtime.kernels
from mlir_nn.runtime.artifact import Artifact
from mlir_nn.runtime.plan import bind
a = Artifact.read(sys.argv[1])
bound = bind(a.plan, [(3, 4), (3, 8), (4, 8), (8,)])
assert not any(m.split(".")[0] in ("mlir", "egglog") for m in sys.modules)
print(len(bound.actions))
"""


def test_runtime_needs_neither_mlir_nor_egglog(artifact, tmp_path):
    path = tmp_path / "mini.mlirnn"
    artifact.write(path)
    proc = subprocess.run([sys.executable, "-c", BLOCKER, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "9"  # of 11 kernels, the reductions' second ones wait for larger batches


@pytest.mark.skipif(has_gpu(), reason="a GPU is present; this checks the error without one")
def test_cuda_backend_says_why_it_cannot_run():
    import mlir_nn
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.runtime.driver import CudaUnavailable
    from mlir_nn.trainer import Trainer

    with pytest.raises(CudaUnavailable, match="cuda-bindings|cuInit|no GPU"):
        mlir_nn.jit(lambda x: x * 2.0, backend="cuda")
    model = MLP(2, [4, 1])
    with pytest.raises(CudaUnavailable, match="cuda-bindings|cuInit|no GPU"):
        Trainer(model, SGD(model.parameters()), backend="cuda")


@needs_gpu
def test_mini_step_on_the_gpu(artifact):
    from mlir_nn.runtime.cuda import CudaStep

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((7, 4), np.float32), rng.standard_normal((7, 8), np.float32)
    w, b = rng.standard_normal((4, 8), np.float32), rng.standard_normal(8, np.float32)
    z = np.maximum(x @ w + b, 0)
    loss = np.mean((z - y) ** 2)
    g = np.where(z > 0, 2 * (z - y) / z.size, 0)
    step = CudaStep(artifact)
    params = [w.copy(), b.copy()]
    (out,) = step.run([x, y], params)
    np.testing.assert_allclose(out, loss, rtol=1e-4)
    np.testing.assert_allclose(params[0], w - 0.1 * x.T @ g, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(params[1], b - 0.1 * g.sum(0), rtol=1e-4, atol=1e-6)
    with pytest.raises(Exception, match="batch size"):
        step.run([x, y[:3]], params)
    # the second call at a batch size captures a CUDA graph, later ones replay it
    w1, b1 = params[0].copy(), params[1].copy()
    for _ in range(3):
        z = np.maximum(x @ w1 + b1, 0)
        g = np.where(z > 0, 2 * (z - y) / z.size, 0)
        w1, b1 = w1 - 0.1 * x.T @ g, b1 - 0.1 * g.sum(0)
        (out,) = step.run([x, y], params)
        np.testing.assert_allclose(out, np.mean((z - y) ** 2), rtol=1e-4)
        np.testing.assert_allclose(params[0], w1, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(params[1], b1, rtol=1e-4, atol=1e-6)


def test_arch_versions_parse_and_bad_ones_are_refused():
    from mlir_nn.runtime.cuda import arch_version
    from mlir_nn.runtime.plan import PlanError

    assert arch_version("sm_90") == (9, 0, False)
    assert arch_version("sm_90a") == (9, 0, True)
    assert arch_version("sm_100") == (10, 0, False)
    assert arch_version("sm_86") == (8, 6, False)
    with pytest.raises(PlanError, match="not a CUDA arch"):
        arch_version("compute_90")


@pytest.mark.parametrize(("arch", "capability", "runs"), [
    ("sm_90a", (9, 0), True), ("sm_90a", (9, 1), False), ("sm_90a", (10, 0), False), ("sm_90a", (8, 9), False),
    ("sm_90", (9, 0), True), ("sm_90", (9, 1), True), ("sm_90", (10, 0), False), ("sm_91", (9, 0), False),
    ("sm_100a", (10, 0), True), ("sm_100a", (10, 1), False), ("sm_86", (8, 9), True), ("sm_89", (8, 6), False),
])
def test_an_arch_specific_cubin_runs_on_its_exact_version_only(arch, capability, runs):
    from mlir_nn.runtime.cuda import runs_on

    assert runs_on(arch, capability) is runs
