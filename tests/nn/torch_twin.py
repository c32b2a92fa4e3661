"""Compare a module with its PyTorch twin in float64: same weights (through load_state_dict),
same input; outputs, input gradients and parameter gradients to 1e-10."""

import numpy as np
import torch

from mlir_nn.engine import Tensor

TOL = dict(rtol=1e-10, atol=1e-12)


def share_weights(ours, theirs):
    """Load the PyTorch module's state_dict (as NumPy arrays) into ours."""
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def assert_same_as_torch(ours, theirs, x, seed=0):
    """Forward and backward of ``sum(out * r)`` (r random) agree with PyTorch's."""
    theirs = theirs.double()
    share_weights(ours, theirs)
    x = np.asarray(x, dtype=np.float64)
    xt = torch.tensor(x, requires_grad=True)
    out_t = theirs(xt)
    r = np.random.default_rng(seed).standard_normal(out_t.shape)
    (out_t * torch.tensor(r)).sum().backward()
    xs = Tensor(x)
    out = ours(xs)
    np.testing.assert_allclose(out.data, out_t.detach().numpy(), **TOL)
    (out * Tensor(r)).sum().backward()
    np.testing.assert_allclose(xs.grad, xt.grad.numpy(), **TOL)
    grads_t = {name: p.grad for name, p in theirs.named_parameters()}
    names = [name for name, _ in ours.named_parameters()]
    assert names == list(grads_t)
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad, grads_t[name].numpy(), **TOL, err_msg=name)
    return out
