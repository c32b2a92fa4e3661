"""micrograd's own engine tests (test/test_engine.py, MIT License, Andrej Karpathy), with only
the import changed.

The bodies below are micrograd's: Value arithmetic checked against PyTorch in float64,
forward exactly and gradients to 1e-6. They pass because Python numbers make float64
values (issue 10, defect 1: in float32, test_more_ops' b.grad was off by 5e-5).
"""

import torch

from mlir_nn.engine import Value


def test_sanity_check():

    x = Value(-4.0)
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    xmg, ymg = x, y

    x = torch.Tensor([-4.0]).double()
    x.requires_grad = True
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    xpt, ypt = x, y

    # forward pass went well
    assert ymg.data == ypt.data.item()
    # backward pass went well
    assert xmg.grad == xpt.grad.item()


def test_more_ops():

    a = Value(-4.0)
    b = Value(2.0)
    c = a + b
    d = a * b + b**3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g += 10.0 / f
    g.backward()
    amg, bmg, gmg = a, b, g

    a = torch.Tensor([-4.0]).double()
    b = torch.Tensor([2.0]).double()
    a.requires_grad = True
    b.requires_grad = True
    c = a + b
    d = a * b + b**3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + (b + a).relu()
    d = d + 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g = g + 10.0 / f
    g.backward()
    apt, bpt, gpt = a, b, g

    tol = 1e-6
    # forward pass went well
    assert abs(gmg.data - gpt.data.item()) < tol
    # backward pass went well
    assert abs(amg.grad - apt.grad.item()) < tol
    assert abs(bmg.grad - bpt.grad.item()) < tol


def test_unary_tensor_fns():
    def test_unary_tensor_fn(value_fn, tensor_fn, xs, tol=1e-6):
        for x in xs:
            xv = Value(x)
            yv = value_fn(xv)
            yv.backward()

            xt = torch.Tensor([x]).double()
            xt.requires_grad = True
            yt = tensor_fn(xt)
            yt.backward()

            # forward pass went well
            assert abs(yv.data - yt.data.item()) < tol
            # backward pass went well
            assert abs(xv.grad - xt.grad.item()) < tol

    test_unary_tensor_fn(Value.tanh, torch.Tensor.tanh, [-1., .123, 2.])
    test_unary_tensor_fn(Value.exp, torch.Tensor.exp, [-1., .123, 2.])
