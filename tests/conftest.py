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


def _session_env(name: str, value: str):
    """Set the environment variable ``name`` to ``value`` for the session, then restore it."""
    old = os.environ.get(name)
    os.environ[name] = value
    yield
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@pytest.fixture(autouse=True, scope="session")
def _blocking_compiles():
    """Compiled results are compared from the first call: no tiered execution unless a test asks."""
    yield from _session_env("MLIR_NN_TIERED", "0")


@pytest.fixture(autouse=True, scope="session")
def _verify_every_hook():
    """Pass pipelines verify the module after each of mlir-nn's hooks too (off by default: a
    cold compile's time), so that a hook that leaves invalid IR is named where it did."""
    yield from _session_env("MLIR_NN_VERIFY", "1")


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory):
    """Compiled steps go to a fresh cache folder, never the user's ~/.cache/mlir-nn."""
    yield from _session_env("MLIR_NN_CACHE_DIR", str(tmp_path_factory.mktemp("mlir-nn-cache")))
