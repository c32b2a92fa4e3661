"""Reading a CUDA artifact file: what is not a regular file is refused before it is read."""

import os

import pytest

from mlir_nn.runtime.artifact import Artifact, ArtifactError


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_what_is_not_a_regular_file_is_refused_without_reading_it(special, tmp_path):
    """/dev/zero was read until memory ran out; a pipe waited for a writer forever."""
    if special == "fifo":
        os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    path = special if special.startswith("/") else str(tmp_path / special)
    with pytest.raises(ArtifactError, match=f"cannot read artifact {path}: not a regular file"):
        Artifact.read(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ArtifactError, match=f"cannot read artifact {tmp_path / 'nope'}: No such file"):
        Artifact.read(tmp_path / "nope")
