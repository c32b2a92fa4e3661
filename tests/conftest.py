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
def _every_call_on_every_thread():
    """Threaded steps run every call on all threads, as the tests that count teams expect, not on the
    width the runtime measures faster (timing-dependent); test_team_width measures."""
    yield from _session_env("MLIR_NN_TEAM_WIDTH", "all")


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory):
    """Compiled steps go to a fresh cache folder, never the user's ~/.cache/mlir-nn."""
    yield from _session_env("MLIR_NN_CACHE_DIR", str(tmp_path_factory.mktemp("mlir-nn-cache")))


SCHEDULE_TARGET = "64,48,1024"  # AVX-512 with Zen 5's caches: what the schedule tests were written for


def replan() -> None:
    """Forget what was planned for the previous target: the cached target, digest and kernels."""
    from mlir_nn.backends.cpu import clear_memory_cache, codegen_digest
    from mlir_nn.support.cpu_target import data_cache_bytes, vector_bytes

    for cached in (vector_bytes, data_cache_bytes, codegen_digest):
        cached.cache_clear()
    clear_memory_cache()


@pytest.fixture
def planned_for_the_schedule_tests(monkeypatch):
    """The code generator plans for ``SCHEDULE_TARGET`` whatever the host (the code still runs on
    it): tests that check the schedules chosen (register blocks, tasks, passes over taps) expect
    those of that target. Without it, on an AVX2 host with a 512 KiB L2 (Zen 3), 17 of them failed
    on their expected plans (the numerics agreed)."""
    from mlir_nn.support.cpu_target import PLANNED_TARGET_ENV

    monkeypatch.setenv(PLANNED_TARGET_ENV, SCHEDULE_TARGET)
    replan()
    yield
    monkeypatch.delenv(PLANNED_TARGET_ENV)
    replan()
