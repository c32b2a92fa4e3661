"""Embedding, attention layers and the GPT against PyTorch in float64: forward and gradients,
and whole compiled Adam steps of the GPT (weights loaded through load_state_dict)."""

import numpy as np
import pytest
import torch

import mlir_nn
from benchmarks.gpt_step import torch_gpt
from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.nn import functional as F
from mlir_nn.optim import Adam
from tests.nn.torch_twin import TOL, assert_same_as_torch, share_weights


def test_embedding_equals_pytorch_with_repeated_indices():
    ours, theirs = nn.Embedding(7, 3, dtype=np.float64), torch.nn.Embedding(7, 3).double()
    share_weights(ours, theirs)
    idx = np.array([[1, 6, 1], [0, 1, 6]])
    out, out_t = ours(idx), theirs(torch.tensor(idx))
    np.testing.assert_allclose(out.data, out_t.detach().numpy(), **TOL)
    r = np.random.default_rng(0).standard_normal(out.shape)
    (out * Tensor(r)).sum().backward()
    (out_t * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), **TOL)
    with pytest.raises(ValueError, match=r"take: indices must be integers in \[-7, 7\)"):
        ours(np.array([[7]]))


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention_equals_pytorch(causal):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 5, 4)) for _ in range(3))
    mask = None if causal else rng.random((5, 5)) < 0.7
    if mask is not None:
        mask[:, 0] = True  # every query sees a key
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    xs = [Tensor(a) for a in (q, k, v)]
    mt = None if mask is None else torch.tensor(mask)
    out_t = torch.nn.functional.scaled_dot_product_attention(*ts, attn_mask=mt, is_causal=causal)
    out = F.scaled_dot_product_attention(*xs, attn_mask=mask, is_causal=causal)
    np.testing.assert_allclose(out.data, out_t.detach().numpy(), **TOL)
    r = rng.standard_normal(out.shape)
    (out * Tensor(r)).sum().backward()
    (out_t * torch.tensor(r)).sum().backward()
    for a, b in zip(xs, ts):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), **TOL)


def test_multihead_attention_equals_pytorch():
    ours = nn.MultiheadAttention(6, 2, batch_first=True, dtype=np.float64)
    theirs = torch.nn.MultiheadAttention(6, 2, batch_first=True).double()
    share_weights(ours, theirs)
    rng = np.random.default_rng(2)
    q, kv = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 3, 6))
    mask = np.triu(np.ones((4, 3), bool), 1)
    out, weights = ours(Tensor(q), Tensor(kv), Tensor(kv), attn_mask=mask)
    out_t, weights_t = theirs(torch.tensor(q), torch.tensor(kv), torch.tensor(kv), attn_mask=torch.tensor(mask))
    np.testing.assert_allclose(out.data, out_t.detach().numpy(), **TOL)
    np.testing.assert_allclose(weights.data, weights_t.detach().numpy(), **TOL)
    out.sum().backward()
    out_t.sum().backward()
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad, grads[name].grad.numpy(), **TOL, err_msg=name)


def test_causal_self_attention_block_equals_pytorch():
    np.random.seed(3)
    ours = nn.CausalSelfAttention(8, 2, dtype=np.float64)
    theirs = torch_gpt(5, 4, 1, 2, 8).h[0].attn
    assert_same_as_torch(ours, theirs, np.random.default_rng(4).standard_normal((2, 4, 8)))
    with pytest.raises(ShapeError, match="CausalSelfAttention: input has shape"):
        ours(Tensor(np.zeros((2, 4, 6))))


@pytest.mark.parametrize("context, width, steps, rows", [
    (6, 8, 4, 3),
    # passes large enough for threads (a (33, 33, 48) activation, (33, 2, 33, 33) scores): their
    # static batch of 33 in one block per computing thread (17 and 16 on two)
    (33, 48, 2, 33),
])
def test_compiled_gpt_adam_steps_equal_pytorch_in_float64(context, width, steps, rows):
    np.random.seed(5)
    model = nn.GPT(11, context, n_layer=1, n_head=2, n_embd=width, dtype=np.float64)
    twin = torch_gpt(11, context, 1, 2, width).double()
    twin.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    opt, opt_t = Adam(model.parameters(), lr=1e-2), torch.optim.Adam(twin.parameters(), lr=1e-2)

    def step(idx, targets):
        opt.zero_grad()
        loss = model.loss(idx, targets)
        loss.backward()
        opt.step()
        return loss

    compiled = mlir_nn.jit(step, backend="cpu", dynamic_batch=False, tiered=False)
    tokens = np.random.default_rng(6).integers(0, 11, (steps, rows, context + 1))
    for batch in tokens:  # integer token arrays, fed in the model's dtype
        loss = compiled(batch[:, :-1], batch[:, 1:])
        opt_t.zero_grad()
        loss_t = twin.loss(torch.tensor(batch[:, :-1]), torch.tensor(batch[:, 1:]))
        loss_t.backward()
        opt_t.step()
        np.testing.assert_allclose(loss, loss_t.item(), **TOL)
    theirs = twin.state_dict()
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, theirs[name].numpy(), **TOL, err_msg=name)
    with pytest.raises(ValueError, match=r"take \(step argument idx\): indices must be integers in \[-11, 11\)"):
        compiled(np.full((rows, context), 11), tokens[0][:, 1:])
