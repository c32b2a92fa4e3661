"""The disk cache of CUDA artifacts: a real compiled step stored, found, and refused when it does not fit."""

import shutil

import numpy as np
import pytest

from mlir_nn.backends import cuda_cache
from mlir_nn.backends.cuda import build_artifact
from mlir_nn.jit import trace_step
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step

pytestmark = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not found (CUDA toolkit not installed)")


def traced(width):
    np.random.seed(0)
    model = MLP(3, [width, 1])
    x, y = np.ones((5, 3), np.float32), np.ones((5, 1), np.float32)
    graph, _, _ = trace_step(train_step(model, SGD(model.parameters(), lr=0.1), mse_loss), [x, y], ["x", "y"])
    return graph


@pytest.fixture(scope="module")
def compiled():
    graph = traced(7)
    return graph, build_artifact(graph, "sm_90")


def test_a_stored_artifact_is_found_for_its_graph_and_arch_only(compiled, tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    graph, artifact = compiled
    assert cuda_cache.load(graph, "sm_90") is None
    path = cuda_cache.store(artifact)
    assert path is not None and path.parent == tmp_path / "cuda"
    found = cuda_cache.load(graph, "sm_90")
    assert found.plan == artifact.plan and found.cubins == artifact.cubins and found.signature == artifact.signature
    assert cuda_cache.load(graph, "sm_80") is None
    assert cuda_cache.load(traced(13), "sm_90") is None


def test_a_damaged_or_foreign_entry_is_a_miss_and_is_rewritten(compiled, tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    graph, artifact = compiled
    path = cuda_cache.store(artifact)
    path.write_bytes(path.read_bytes()[:1000])
    assert cuda_cache.load(graph, "sm_90") is None
    other = traced(13)
    path.write_bytes(build_artifact(other, "sm_90").to_bytes())  # another graph's artifact under this key
    assert cuda_cache.load(graph, "sm_90") is None
    cuda_cache.store(artifact)
    assert cuda_cache.load(graph, "sm_90").graph_fingerprint == graph.fingerprint()


def test_an_unwritable_cache_only_costs_a_compile(compiled, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(blocker))
    graph, artifact = compiled
    assert cuda_cache.store(artifact) is None
    assert cuda_cache.load(graph, "sm_90") is None


def test_a_load_and_a_store_fingerprint_the_graph_once_between_them(compiled, tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    graph, artifact = compiled
    fingerprints = []
    real = type(graph).fingerprint
    monkeypatch.setattr(type(graph), "fingerprint", lambda g: fingerprints.append(g) or real(g))
    assert cuda_cache.load(graph, "sm_90") is None  # what a compile does around building the artifact
    cuda_cache.store(artifact)
    assert len(fingerprints) == 1
    assert cuda_cache.load(graph, "sm_90") is not None and len(fingerprints) == 2
