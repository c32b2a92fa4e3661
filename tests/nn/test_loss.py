"""Losses (modules and functional forms) against PyTorch in float64: values and gradients to
1e-10, every reduction, batch 1 included, eagerly and in one compiled step per backend."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.nn import functional as F

C = 4
TOL = dict(rtol=1e-10, atol=1e-12)


def _data(name, n, rng):
    """(input, target) arrays for a loss; labels as float64 (our form) - torch gets int64."""
    x = rng.standard_normal((n, C)) * 3
    if name in ("CrossEntropyLoss", "CrossEntropyLossSmooth", "CrossEntropyLossIgnore", "NLLLoss"):
        labels = rng.integers(0, C, n).astype(np.float64)
        if name == "CrossEntropyLossIgnore" and n > 1:
            labels[1] = 2.0  # ignore_index=2 below
        return x, labels
    if name == "CrossEntropyLossProbs":
        return x, rng.dirichlet(np.ones(C), n)
    if name == "BCELoss":
        return rng.uniform(0.02, 0.98, (n, C)), rng.uniform(0, 1, (n, C))
    if name in ("BCEWithLogitsLoss", "BCEWithLogitsPosWeight"):
        x[0, 0] = 60.0  # far out: still finite and exact
        return x, rng.uniform(0, 1, (n, C))
    return x, rng.standard_normal((n, C)) * 2


WEIGHT = np.array([0.5, 2.0, 1.0, 3.0])
POS_WEIGHT = np.array([1.5, 0.5, 2.0, 1.0])
CASES = {  # name: (ours(reduction), torch's(reduction))
    "MSELoss": (lambda r: nn.MSELoss(reduction=r), lambda r: torch.nn.MSELoss(reduction=r)),
    "L1Loss": (lambda r: nn.L1Loss(reduction=r), lambda r: torch.nn.L1Loss(reduction=r)),
    "SmoothL1Loss": (lambda r: nn.SmoothL1Loss(reduction=r, beta=0.7),
                     lambda r: torch.nn.SmoothL1Loss(reduction=r, beta=0.7)),
    "HuberLoss": (lambda r: nn.HuberLoss(reduction=r, delta=1.3), lambda r: torch.nn.HuberLoss(reduction=r, delta=1.3)),
    "BCELoss": (lambda r: nn.BCELoss(reduction=r), lambda r: torch.nn.BCELoss(reduction=r)),
    "BCEWithLogitsLoss": (lambda r: nn.BCEWithLogitsLoss(reduction=r),
                          lambda r: torch.nn.BCEWithLogitsLoss(reduction=r)),
    "BCEWithLogitsPosWeight": (
        lambda r: nn.BCEWithLogitsLoss(reduction=r, pos_weight=POS_WEIGHT, weight=WEIGHT),
        lambda r: torch.nn.BCEWithLogitsLoss(reduction=r, pos_weight=torch.tensor(POS_WEIGHT),
                                             weight=torch.tensor(WEIGHT))),
    "CrossEntropyLoss": (lambda r: nn.CrossEntropyLoss(reduction=r), lambda r: torch.nn.CrossEntropyLoss(reduction=r)),
    "CrossEntropyLossProbs": (lambda r: nn.CrossEntropyLoss(reduction=r, label_smoothing=0.1),
                              lambda r: torch.nn.CrossEntropyLoss(reduction=r, label_smoothing=0.1)),
    "CrossEntropyLossSmooth": (lambda r: nn.CrossEntropyLoss(weight=WEIGHT, reduction=r, label_smoothing=0.2),
                               lambda r: torch.nn.CrossEntropyLoss(weight=torch.tensor(WEIGHT), reduction=r,
                                                                   label_smoothing=0.2)),
    "CrossEntropyLossIgnore": (lambda r: nn.CrossEntropyLoss(reduction=r, ignore_index=2, label_smoothing=0.1),
                               lambda r: torch.nn.CrossEntropyLoss(reduction=r, ignore_index=2, label_smoothing=0.1)),
    "NLLLoss": (lambda r: nn.NLLLoss(weight=WEIGHT, reduction=r),
                lambda r: torch.nn.NLLLoss(weight=torch.tensor(WEIGHT), reduction=r)),
}
LABELS = ("CrossEntropyLoss", "CrossEntropyLossSmooth", "CrossEntropyLossIgnore", "NLLLoss")
REDUCTIONS = ("mean", "sum", "none")


def _torch(name, reduction, x, target, weight):
    xt = torch.tensor(x, requires_grad=True)
    tt = torch.tensor(target.astype(np.int64)) if name in LABELS else torch.tensor(target)
    loss = CASES[name][1](reduction)(xt, tt)
    (loss * torch.tensor(weight)).sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()



@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("n", [1, 6])
def test_losses_equal_pytorch_eagerly(name, n):
    rng = np.random.default_rng(n)
    for reduction in REDUCTIONS:
        x, target = _data(name, n, rng)
        ours = CASES[name][0](reduction)
        xs = Tensor(x)
        loss = ours(xs, target)
        weight = rng.standard_normal(loss.shape)
        (loss * Tensor(weight)).sum().backward()
        want, want_grad = _torch(name, reduction, x, target, weight)
        np.testing.assert_allclose(loss.data, want, **TOL, err_msg=f"{name} {reduction}")
        np.testing.assert_allclose(xs.grad, want_grad, **TOL, err_msg=f"{name} {reduction} gradient")


def _all_losses_step(x, target, labels):
    """Every loss and reduction in one step: each value, and the input's gradient of their weighted sum."""
    total, values = None, []
    for i, name in enumerate(CASES):
        for j, reduction in enumerate(REDUCTIONS):
            arg = x if name != "BCELoss" else x.sigmoid()
            loss = CASES[name][0](reduction)(arg, labels if name in LABELS else target)
            values.append(loss)
            term = (loss * (1.0 + 0.1 * i - 0.3 * j)).sum()
            total = term if total is None else total + term
    total.backward()
    return (x.grad, *values)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_losses_compiled_equal_eager(backend):
    step = mlir_nn.jit(_all_losses_step, backend=backend, tiered=False)
    rng = np.random.default_rng(5)
    for n in (5, 1):
        x, target = rng.standard_normal((n, C)) * 3, rng.uniform(0, 1, (n, C))
        labels = rng.integers(0, C, n).astype(np.float64)
        labels[-1] = 2.0 if n > 1 else labels[-1]  # an ignored row (a batch of one ignored row is 0/0, NaN)
        xs = Tensor(x)
        want = _all_losses_step(xs, Tensor(target), Tensor(labels))
        got = step(x, target, labels)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, np.asarray(w), rtol=1e-9, atol=1e-11)


def test_default_cross_entropy_keeps_the_fused_gradient():
    from mlir_nn.egraph import optimize
    from mlir_nn.jit import trace_step

    def step(x, y):
        loss = nn.CrossEntropyLoss()(x, y)
        loss.backward()
        return loss, x.grad

    graph, _, _ = trace_step(step, [np.zeros((4, 3)), np.zeros(4)], ["x", "y"])
    assert "softmax_xent_grad" in optimize(graph, batch_estimate=4)[0].op_counts()


def test_eager_labels_equal_to_the_default_ignore_index_are_ignored():
    x = np.random.default_rng(0).standard_normal((3, 2))
    ours = F.cross_entropy(x, np.array([1.0, -100.0, 0.0])).item()
    theirs = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor([1, -100, 0])).item()
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_bce_with_logits_is_finite_for_extreme_logits():
    x = np.array([[-1e4, -700.0, 0.0, 700.0, 1e4]])
    y = np.array([[1.0, 0.0, 0.5, 1.0, 0.0]])
    xs = Tensor(x)
    loss = F.binary_cross_entropy_with_logits(xs, y, reduction="none")
    loss.sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.binary_cross_entropy_with_logits(xt, torch.tensor(y), reduction="none")
    want.sum().backward()
    assert np.all(np.isfinite(loss.data)) and np.all(np.isfinite(xs.grad))
    np.testing.assert_allclose(loss.data, want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(xs.grad, xt.grad.numpy(), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("call,error,message", [
    (lambda: nn.MSELoss(reduction="avg"), ValueError, "MSELoss: reduction must be one of 'mean', 'sum', 'none'"),
    (lambda: F.l1_loss(np.zeros((2, 3)), np.zeros((3, 2))), ShapeError,
     r"l1_loss: input shape \(2, 3\) differs from target shape \(3, 2\)"),
    (lambda: F.binary_cross_entropy(np.array([1.5]), np.array([1.0])), ValueError,
     r"binary_cross_entropy: input must hold probabilities in \[0, 1\]"),
    (lambda: F.cross_entropy(np.zeros((2, 3)), np.zeros(3)), ShapeError, r"labels \(3,\) do not match logits \(2, 3\)"),
    (lambda: F.cross_entropy(np.zeros((2, 3)), np.array([0.0, 3.0])), ValueError,
     r"one_hot: labels must be integers in \[0, 3\)"),
    (lambda: F.cross_entropy(np.zeros((2, 3)), np.zeros(2), weight=np.ones(2)), ShapeError,
     r"weight has shape \(2,\), expected \(3,\)"),
    (lambda: F.cross_entropy(np.zeros((2, 3)), np.zeros(2), label_smoothing=1.5), ValueError,
     r"label_smoothing must be in \[0, 1\]"),
    (lambda: F.smooth_l1_loss(np.zeros(2), np.zeros(2), beta=-1), ValueError, "beta must be >= 0"),
    (lambda: F.huber_loss(np.zeros(2), np.zeros(2), delta=0), ValueError, "delta must be > 0"),
    (lambda: F.nll_loss(np.zeros((2, 3)), np.zeros((2, 3))), ShapeError, "nll_loss: target must be class labels"),
])
def test_bad_loss_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
