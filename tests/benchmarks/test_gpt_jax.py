"""The JAX GPT of the step benchmark against PyTorch's twin in float64: same loss, and the same
weights after Adam steps (so the benchmark compares equal work)."""

import numpy as np
import pytest
import torch

from benchmarks.gpt_step import torch_gpt

jax = pytest.importorskip("jax")
from benchmarks.gpt_jax import adam_step  # noqa: E402

CONFIG = dict(n_layer=2, n_head=2, n_embd=8)


def test_jax_gpt_adam_steps_equal_pytorch():
    torch.manual_seed(0)
    model = torch_gpt(11, 6, **CONFIG).double()
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        step = adam_step(state, CONFIG["n_layer"], CONFIG["n_head"], lr=1e-2)
        for _ in range(3):
            tokens = rng.integers(0, 11, (3, 6))
            x, y = tokens, np.roll(tokens, -1, axis=1)
            opt.zero_grad()
            loss = model.loss(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            opt.step()
            np.testing.assert_allclose(float(step(x, y)), loss.item(), rtol=1e-10)
        for name, w in model.state_dict().items():
            np.testing.assert_allclose(np.asarray(step.params["params"][name]), w.numpy(), rtol=1e-9, atol=1e-12,
                                       err_msg=name)
