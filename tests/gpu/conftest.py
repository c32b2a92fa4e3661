import shutil
from pathlib import Path

import pytest

from mlir_nn.gpu import compile_linalg

MINI = (Path(__file__).parent / "data" / "mini_step.mlir").read_text()
PTXAS = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if Path("/usr/local/cuda/bin/ptxas").exists() else None)


@pytest.fixture(scope="session")
def mini_program():
    """A hand-written linalg step (matmul, bias+relu, mse, its gradient, SGD) for sm_80 and sm_90."""
    return compile_linalg(MINI, "mini", archs=("sm_80", "sm_90"))
