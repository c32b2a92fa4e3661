"""Property-based checks of whole training steps: random MLPs, batches, dtypes, optimizers.

Each example compiles a new step, so examples are few and drawn deterministically."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step

TOLERANCE = {"float32": 2e-4, "float64": 1e-10}

optimizers = st.one_of(
    st.builds(lambda lr, mu, wd: (SGD, {"lr": lr, "momentum": mu, "weight_decay": wd}),
              st.sampled_from([0.0, 0.01, 0.1]), st.sampled_from([0.0, 0.9]), st.sampled_from([0.0, 0.05])),
    st.builds(lambda lr, wd: (Adam, {"lr": lr, "weight_decay": wd}),
              st.sampled_from([1e-3, 0.05]), st.sampled_from([0.0, 0.01])),
)


@settings(max_examples=6, derandomize=True, deadline=None)
@given(widths=st.lists(st.integers(1, 9), min_size=2, max_size=4), batches=st.lists(st.integers(1, 13), min_size=3,
       max_size=3), dtype=st.sampled_from(["float32", "float64"]), optimizer=optimizers, seed=st.integers(0, 99))
def test_compiled_steps_match_the_reference_after_several_steps(widths, batches, dtype, optimizer, seed):
    cls, args = optimizer
    np.random.seed(seed)
    models = [MLP(widths[0], widths[1:], dtype=dtype) for _ in range(2)]
    for a, b in zip(*(m.parameters() for m in models)):
        b.data[...] = a.data
    steps = [jit(train_step(m, cls(m.parameters(), **args)), backend=backend)
             for m, backend in zip(models, ("numpy", "cpu"))]
    rng = np.random.default_rng(seed)
    for batch in batches:
        x = rng.standard_normal((batch, widths[0])).astype(dtype)
        y = rng.standard_normal((batch, widths[-1])).astype(dtype)
        want, got = (float(step(x, y)) for step in steps)
        np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    for a, b in zip(*(m.parameters() for m in models)):
        np.testing.assert_allclose(b.data, a.data, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
