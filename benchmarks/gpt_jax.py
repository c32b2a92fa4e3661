"""The GPT of ``benchmarks/gpt_step.py`` hand-written in ``jax.numpy``: the same model (parameters
named as in PyTorch's state_dict) and a jitted training step with PyTorch's Adam (no weight decay)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

Params = dict[str, object]


def gpt_loss(params: Mapping[str, object], idx: object, targets: object, n_layer: int, n_head: int) -> object:
    """Mean cross-entropy of the GPT's logits at every position (PyTorch's GPT twin, in jax.numpy)."""
    import jax
    import jax.numpy as jnp

    def linear(x, name: str, bias: bool = True):
        y = x @ params[f"{name}.weight"].T
        return y + params[f"{name}.bias"] if bias else y

    def layer_norm(x, name: str):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * params[f"{name}.weight"] + params[f"{name}.bias"]

    def attention(x, name: str):
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, n_head, c // n_head).transpose(0, 2, 1, 3)
                   for z in jnp.split(linear(x, f"{name}.c_attn"), 3, axis=2))
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(c // n_head))
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
        y = jax.nn.softmax(scores, axis=-1) @ v
        return linear(y.transpose(0, 2, 1, 3).reshape(b, t, c), f"{name}.c_proj")

    t = idx.shape[1]
    x = params["wte.weight"][idx] + params["wpe.weight"][:t]
    for i in range(n_layer):
        h = f"h.{i}"
        x = x + attention(layer_norm(x, f"{h}.ln_1"), f"{h}.attn")
        mlp = jax.nn.gelu(linear(layer_norm(x, f"{h}.ln_2"), f"{h}.mlp.c_fc"), approximate=False)
        x = x + linear(mlp, f"{h}.mlp.c_proj")
    logits = linear(layer_norm(x, "ln_f"), "lm_head", bias=False)
    logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
    return -jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1).mean()


def adam_step(state: Mapping[str, np.ndarray], n_layer: int, n_head: int,
              lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8
              ) -> Callable[[np.ndarray, np.ndarray], object]:
    """A jitted step (loss, gradients, PyTorch's Adam update) from the given weights; returns the loss each call."""
    import jax
    import jax.numpy as jnp

    b1, b2 = betas
    grad_fn = jax.value_and_grad(gpt_loss)

    @jax.jit
    def step(params, m, v, count, idx, targets):
        loss, grads = grad_fn(params, idx, targets, n_layer, n_head)
        count = count + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        scale = lr / (1 - b1 ** count)
        root = jnp.sqrt(1 - b2 ** count)
        params = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) / root + eps), params, m, v)
        return loss, params, m, v, count

    carry = {"params": {k: jnp.asarray(w) for k, w in state.items()}}
    carry["m"] = jax.tree_util.tree_map(jnp.zeros_like, carry["params"])
    carry["v"] = jax.tree_util.tree_map(jnp.zeros_like, carry["params"])
    carry["count"] = jnp.zeros((), carry["params"]["wte.weight"].dtype)

    def run(idx: np.ndarray, targets: np.ndarray) -> object:
        loss, carry["params"], carry["m"], carry["v"], carry["count"] = step(
            carry["params"], carry["m"], carry["v"], carry["count"], idx, targets)
        return loss.block_until_ready()

    run.params = carry  # type: ignore[attr-defined]  # the live weights, for tests
    return run
