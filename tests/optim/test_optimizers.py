"""Optimizers against hand-computed PyTorch-rule updates, eager and jitted."""

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.engine import Tensor
from mlir_nn.optim import SGD, Adam


def quadratic_step(p, opt):
    """loss = sum(p * c) + 0.5 * sum(p^2): grad = c + p."""
    c = np.array([0.5, -1.0, 2.0])

    def step(scale):
        loss = ((p * Tensor(c) * scale).sum() + 0.5 * (p * p).sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step, c


def sgd_reference(p0, c, lr, momentum, wd, steps):
    p, buf = p0.copy(), None
    for _ in range(steps):
        g = c + p + wd * p
        buf = g if buf is None else momentum * buf + g
        p = p - lr * (buf if momentum else g)
    return p


def adam_reference(p0, c, lr, betas, eps, wd, steps):
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for t in range(1, steps + 1):
        g = c + p + wd * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.0, 0.1), (0.8, 0.05)])
def test_sgd_matches_hand_computed_updates(compiled, momentum, wd):
    p0 = np.array([1.0, -2.0, 0.5])
    p = Tensor(p0)
    step, c = quadratic_step(p, SGD([p], lr=0.1, momentum=momentum, weight_decay=wd))
    run = jit(step) if compiled else step
    for _ in range(5):
        run(np.float64(1.0)) if compiled else run(1.0)
    np.testing.assert_allclose(p.data, sgd_reference(p0, c, 0.1, momentum, wd, 5), rtol=1e-12)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adam_matches_hand_computed_updates(compiled, wd):
    p0 = np.array([1.0, -2.0, 0.5])
    p = Tensor(p0)
    step, c = quadratic_step(p, Adam([p], lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd))
    run = jit(step) if compiled else step
    for _ in range(7):
        run(np.float64(1.0)) if compiled else run(1.0)
    np.testing.assert_allclose(p.data, adam_reference(p0, c, 0.05, (0.9, 0.99), 1e-8, wd, 7), rtol=1e-10)


def test_seed_l2_rule_is_weight_decay_two_lambda():
    lam, lr = 0.01, 0.1
    p = Tensor(np.array([1.0, -2.0, 0.5]))
    step, c = quadratic_step(p, SGD([p], lr=lr, weight_decay=2 * lam))
    p0 = p.data.copy()
    step(1.0)
    np.testing.assert_allclose(p.data, p0 - lr * ((c + p0) + 2 * lam * p0), rtol=1e-12)


def test_optimizer_argument_checks():
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([])
    with pytest.raises(ValueError, match="lr must be >= 0"):
        Adam([Tensor(1.0)], lr=-1e-3)
    assert SGD([Tensor(1.0)], lr=0).lr == 0.0  # frozen phases and warm-up schedules start at 0
