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
