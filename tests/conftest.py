import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "mlir_nn", deadline=None, max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "40")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("mlir_nn")


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)


@pytest.fixture(autouse=True, scope="session")
def _blocking_compiles():
    """Compiled results are compared from the first call: no tiered execution unless a test asks."""
    old = os.environ.get("MLIR_NN_TIERED")
    os.environ["MLIR_NN_TIERED"] = "0"
    yield
    if old is None:
        os.environ.pop("MLIR_NN_TIERED", None)
    else:
        os.environ["MLIR_NN_TIERED"] = old


@pytest.fixture(autouse=True, scope="session")
def _verify_every_hook():
    """Pass pipelines verify the module after each of mlir-nn's hooks too (off by default: a
    cold compile's time), so that a hook that leaves invalid IR is named where it did."""
    old = os.environ.get("MLIR_NN_VERIFY")
    os.environ["MLIR_NN_VERIFY"] = "1"
    yield
    if old is None:
        os.environ.pop("MLIR_NN_VERIFY", None)
    else:
        os.environ["MLIR_NN_VERIFY"] = old


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory):
    """Compiled steps go to a fresh cache folder, never the user's ~/.cache/mlir-nn."""
    old = os.environ.get("MLIR_NN_CACHE_DIR")
    os.environ["MLIR_NN_CACHE_DIR"] = str(tmp_path_factory.mktemp("mlir-nn-cache"))
    yield
    if old is None:
        os.environ.pop("MLIR_NN_CACHE_DIR", None)
    else:
        os.environ["MLIR_NN_CACHE_DIR"] = old
