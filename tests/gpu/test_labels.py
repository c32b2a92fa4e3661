"""A CUDA step's class labels are checked before anything reaches the device, as on numpy and cpu."""

import io
import json
import zipfile

import numpy as np
import pytest

from mlir_nn.backends.cuda import build_artifact
from mlir_nn.backends.reference import ReferenceBackend
from mlir_nn.runtime.artifact import Artifact, ArtifactError
from mlir_nn.runtime.cuda import ArgumentCheck, CudaStep
from tests.gpu.device import needs_gpu
from tests.gpu.test_classification import classifier_graph

BAD_LABELS = [[0.0, 5.0], [-1.0, 0.0], [0.5, 1.0], [1e9, 0.0]]


@pytest.fixture(scope="module")
def graph():
    return classifier_graph(labels=True)


@pytest.fixture(scope="module")
def artifact(graph):
    return build_artifact(graph, "sm_90")  # MLIR and ptxas, no GPU


def _arguments(graph, labels):
    x = np.zeros((len(labels), 6), np.float32)
    params = [np.full([int(d) for d in n.shape], 0.5, np.float32) for n in graph.params]
    return [x, np.asarray(labels, np.float32)], params


def test_the_signature_says_which_input_holds_labels_of_how_many_classes(artifact):
    inputs = artifact.signature["inputs"]
    assert [d.get("classes") for d in inputs] == [None, 5]
    assert Artifact.from_bytes(artifact.to_bytes()).signature == artifact.signature


@pytest.mark.parametrize("labels", BAD_LABELS, ids=["too large", "negative", "fractional", "1e9"])
def test_bad_labels_are_refused_with_the_numpy_backends_error(graph, artifact, labels):
    inputs, params = _arguments(graph, labels)
    with pytest.raises(ValueError) as numpy_error:
        ReferenceBackend().compile(graph).run(inputs, [p.copy() for p in params])
    with pytest.raises(ValueError) as cuda_error:
        ArgumentCheck(artifact.signature)(inputs, params)
    assert str(cuda_error.value) == str(numpy_error.value)
    assert "one_hot: labels must be integers in [0, 5)" in str(cuda_error.value)


def test_good_labels_pass(artifact, graph):
    ArgumentCheck(artifact.signature)(*_arguments(graph, [0.0, 4.0, 2.0]))


def test_an_artifact_without_label_classes_is_refused(artifact, tmp_path):
    """Format 1 artifacts do not say which inputs are labels: running one would skip the check."""
    path = tmp_path / "old.mlirnn"
    with zipfile.ZipFile(path, "w") as old, zipfile.ZipFile(io.BytesIO(artifact.to_bytes())) as new:
        for name in new.namelist():
            data = new.read(name)
            if name == "manifest.json":
                manifest = json.loads(data)
                manifest["format_version"] = 1
                for d in manifest["signature"]["inputs"]:
                    d.pop("classes", None)
                data = json.dumps(manifest).encode()
            old.writestr(name, data)
    with pytest.raises(ArtifactError, match="format version 1"):
        Artifact.read(path)


@needs_gpu
def test_bad_labels_never_reach_the_device_nor_touch_a_parameter(graph, artifact):
    step = CudaStep(artifact)
    inputs, params = _arguments(graph, [0.0, 5.0])
    before = [p.copy() for p in params]
    with pytest.raises(ValueError, match="one_hot: labels"):
        step.run(inputs, params)
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p, b)
