"""Optimizers against hand-computed PyTorch-rule updates, eager and jitted."""

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.engine import Tensor
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step


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


def _trained_adam():
    np.random.seed(0)
    model = MLP(2, [3, 1])
    opt = Adam(model.parameters(), lr=0.01)
    step = jit(train_step(model, opt), backend="numpy")
    step(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32))
    return opt


def _spoiled(change):
    state = _trained_adam().state_dict()
    change(state)
    return state


BAD_OPTIMIZER_STATES = {
    "lr negative": (lambda s: s["param_groups"][0].update(lr=-1.0), "lr must be >= 0"),
    "lr fine, then a bad state": (lambda s: (s["param_groups"][0].update(lr=0.5),
                                             s["state"][1].update(exp_avg=np.ones(7))), r"has shape \(7,\)"),
    "index -1": (lambda s: s["state"].update({-1: s["state"].pop(3)}), "state for parameter -1"),
    "index past the end": (lambda s: s["state"].update({4: s["state"][3]}), "state for parameter 4"),
    "NaN state": (lambda s: s["state"][0]["exp_avg"].fill(np.nan), "exp_avg of parameter 0 must hold finite"),
    "0-d exp_avg": (lambda s: s["state"][0].update(exp_avg=np.float32(0)), r"exp_avg of parameter 0 has shape \(\)"),
    "a slot missing a moment": (lambda s: s["state"][2].pop("exp_avg_sq"), "state of parameter 2 has"),
    "an unknown state name": (lambda s: s["state"][2].update(momentum_buffer=np.zeros(3)), "state of parameter 2"),
    "an SGD group": (lambda s: s["param_groups"][0].update(momentum=0.9), "has momentum, which Adam does not have"),
    "an unknown top-level key": (lambda s: s.update(extra=1), "got \\['extra', 'param_groups', 'state'\\]"),
    "a slot that is a list": (lambda s: s["state"].update({0: [1, 2]}), "state of parameter 0 has list"),
    # outside their domains the next step silently computes NaN (sqrt of a negative) or divides by zero
    "a negative second moment": (lambda s: s["state"][1]["exp_avg_sq"].fill(-1.0),
                                 "exp_avg_sq of parameter 1 must hold numbers >= 0; it has -1.0"),
    "a negative step count": (lambda s: s["state"][0].update(step=np.float32(-1)),
                              r"step of parameter 0 must hold a whole number >= 0 \(a count\); it has -1.0"),
    "a fractional step count": (lambda s: s["state"][3].update(step=np.float32(2.5)), "it has 2.5"),
    # a schedule's keys in a group were written as given: its next step failed with a raw TypeError
    "a schedule's rate as text": (lambda s: s["param_groups"][0].update(initial_lr="x"),
                                  "Adam: initial_lr must be a real number, got str 'x'"),
    "a schedule's momentum as None": (lambda s: s["param_groups"][0].update(base_momentum=None),
                                      "Adam: base_momentum must be a real number"),
    "a negative schedule rate": (lambda s: s["param_groups"][0].update(max_lr=-1.0), "Adam: max_lr must be >= 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIMIZER_STATES))
def test_a_bad_optimizer_state_is_refused_and_changes_nothing(case):
    change, match = BAD_OPTIMIZER_STATES[case]
    opt = _trained_adam()
    before = opt.state_dict()
    with pytest.raises((TypeError, ValueError), match=match):
        opt.load_state_dict(_spoiled(change))
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    assert sorted(after["state"]) == sorted(before["state"])
    for i, slot in before["state"].items():
        assert sorted(after["state"][i]) == sorted(slot)
        for key, value in slot.items():
            np.testing.assert_array_equal(after["state"][i][key], value)


def test_an_sgd_checkpoint_does_not_load_into_adam_nor_the_reverse():
    opt = _trained_adam()
    sgd = SGD(opt.parameters, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="has dampening, momentum, nesterov, which Adam does not have"):
        opt.load_state_dict(sgd.state_dict())
    with pytest.raises(ValueError, match="has betas, eps, which SGD does not have"):
        sgd.load_state_dict(opt.state_dict())
