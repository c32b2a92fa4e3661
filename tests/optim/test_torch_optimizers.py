"""The optimizers against torch.optim in float64 over several steps (1e-10), eagerly and
compiled, with parameter groups, schedules and gradient clipping; and the public way to write
a new optimizer."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn, optim
from mlir_nn.engine import Tensor

STEPS = 6
CONFIGS = {  # name: (our class, torch's class, defaults, second group's overrides)
    "SGD-nesterov": (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
                     dict(lr=0.05)),
    "SGD-dampening": (optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.8, dampening=0.3), dict(weight_decay=0.1)),
    "Adam": (optim.Adam, torch.optim.Adam, dict(lr=0.05, betas=(0.8, 0.99)), dict(lr=0.01, weight_decay=0.02)),
    "AdamW": (optim.AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1), dict(betas=(0.5, 0.9), eps=1e-6)),
    "RMSprop": (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, alpha=0.9), dict(weight_decay=0.05)),
    "RMSprop-centered": (optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5),
                         dict(momentum=0.0)),
    "Adagrad": (optim.Adagrad, torch.optim.Adagrad,
                dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.1, weight_decay=0.01), dict(eps=1e-6)),
}


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    w0, b0 = rng.standard_normal((3, 2)), rng.standard_normal(2)
    batches = [(rng.standard_normal((5, 3)), rng.standard_normal((5, 2))) for _ in range(STEPS)]
    return w0, b0, batches


def _schedule(name, opt, module):
    if name == "step":
        return module.StepLR(opt, step_size=2, gamma=0.5)
    if name == "onecycle":
        return module.OneCycleLR(opt, max_lr=[0.2, 0.1], total_steps=STEPS, pct_start=0.4)
    return module.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.5)


def _run_torch(config, schedule, clip):
    ours_cls, cls, defaults, second = CONFIGS[config]
    w0, b0, batches = _problem()
    w, b = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    opt = cls([{"params": [w]}, {"params": [b], **second}], **defaults)
    sched = _schedule(schedule, opt, torch.optim.lr_scheduler) if schedule else None
    losses = []
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        loss = ((torch.tensor(x) @ w + b - torch.tensor(y)) ** 2).mean()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_([w, b], 0.5)
            torch.nn.utils.clip_grad_value_([w], 0.2)
        opt.step()
        losses.append(loss.item())
        if i == 2 and sched is None:  # (PyTorch's StepLR chains from the current rate, ours from initial_lr)
            opt.param_groups[1]["lr"] *= 0.5
        if sched is not None:
            sched.step(loss.item()) if schedule == "plateau" else sched.step()
    return losses, w.detach().numpy(), b.detach().numpy(), opt.state_dict()


def _run_ours(config, schedule, clip, backend):
    ours_cls, _, defaults, second = CONFIGS[config]
    w0, b0, batches = _problem()
    w, b = Tensor(w0), Tensor(b0)
    opt = ours_cls([{"params": [w]}, {"params": [b], **second}], **defaults)
    sched = _schedule(schedule, opt, optim.lr_scheduler) if schedule else None

    def step(x, y):
        opt.zero_grad()
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_([w, b], 0.5)
            nn.utils.clip_grad_value_([w], 0.2)
        opt.step()
        return loss

    run = mlir_nn.jit(step, backend=backend, tiered=False) if backend else step
    losses, compiled = [], None
    for i, (x, y) in enumerate(batches):
        loss = float(run(x, y) if backend else run(Tensor(x), Tensor(y)))
        losses.append(loss)
        if backend:
            compiled = compiled or run.lower(x, y)
            assert run.lower(x, y) is compiled  # group hyperparameters and schedules never re-trace
        if i == 2 and sched is None:
            opt.param_groups[1]["lr"] *= 0.5
        if sched is not None:
            sched.step(loss) if schedule == "plateau" else sched.step()
    return losses, w.data, b.data, opt.state_dict()


def _compare(ours, theirs):
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-10, atol=1e-12)
    for a, e in zip(ours[1:3], theirs[1:3]):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("backend", [None, "numpy"])
def test_optimizers_equal_torch_over_several_steps(config, backend):
    _compare(_run_ours(config, None, False, backend), _run_torch(config, None, False))


@pytest.mark.parametrize("config,schedule,clip", [("SGD-nesterov", "onecycle", True), ("Adam", "onecycle", False),
                                                  ("AdamW", "step", True), ("RMSprop", "plateau", False),
                                                  ("Adagrad", "plateau", True)])
@pytest.mark.parametrize("backend", [None, "cpu"])
def test_schedules_and_clipping_equal_torch(config, schedule, clip, backend):
    _compare(_run_ours(config, schedule, clip, backend), _run_torch(config, schedule, clip))


@pytest.mark.parametrize("config", ["AdamW", "RMSprop-centered", "Adagrad"])
def test_state_dicts_have_pytorchs_layout(config):
    ours, theirs = _run_ours(config, None, False, None)[3], _run_torch(config, None, False)[3]
    assert ours["param_groups"][1]["params"] == theirs["param_groups"][1]["params"] == [1]
    for i in (0, 1):
        assert set(ours["state"][i]) == set(theirs["state"][i])
        for key, value in theirs["state"][i].items():
            np.testing.assert_allclose(ours["state"][i][key], value.numpy(), rtol=1e-10, atol=1e-12)
        for key in ours["param_groups"][i]:
            if key != "params":
                assert ours["param_groups"][i][key] == pytest.approx(theirs["param_groups"][i][key])
    w0, b0, _ = _problem()
    fresh = CONFIGS[config][0]([{"params": [Tensor(w0)]}, {"params": [Tensor(b0)]}], **CONFIGS[config][2])
    fresh.load_state_dict(ours)
    assert fresh.param_groups[1]["lr"] == ours["param_groups"][1]["lr"]


class SignMomentum(optim.Optimizer):
    """A user-written optimizer through the public API (signSGD with momentum)."""

    def __init__(self, params, lr=0.01, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def update(self, p, grad, state, group):
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = optim.zeros_like(p)
        buf = state["momentum_buffer"]
        buf *= group["momentum"]
        buf += grad
        p -= group["lr"] * ((buf > 0) - (buf < 0))


def _sign_momentum_reference(p0, batches, lr, momentum, lr_after):
    w, buf = p0.copy(), np.zeros_like(p0)
    for i, (x, y) in enumerate(batches):
        grad = 2 * x.T @ (x @ w - y) / y.size
        buf = momentum * buf + grad
        w = w - (lr if i < 3 else lr_after) * np.sign(buf)
    return w


@pytest.mark.parametrize("backend", [None, "numpy", "cpu"])
def test_a_user_written_optimizer_runs_eagerly_and_compiled(backend):
    w0, _, batches = _problem()
    w = Tensor(w0)
    opt = SignMomentum([w], lr=0.05, momentum=0.5)

    def step(x, y):
        opt.zero_grad()
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    run = mlir_nn.jit(step, backend=backend, tiered=False) if backend else step
    for i, (x, y) in enumerate(batches):
        run(x, y) if backend else run(Tensor(x), Tensor(y))
        if i == 2:
            opt.lr = 0.02
    np.testing.assert_allclose(w.data, _sign_momentum_reference(w0, batches, 0.05, 0.5, 0.02), rtol=1e-12)
    assert set(opt.state_dict()["state"][0]) == {"momentum_buffer"}


def test_optimizer_and_group_argument_checks():
    w = Tensor(np.zeros(2))
    with pytest.raises(ValueError, match="SGD: nesterov momentum requires a momentum > 0 and zero dampening"):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="a parameter appears in more than one group"):
        optim.Adam([{"params": [w]}, {"params": [w]}])
    opt = optim.RMSprop([{"params": [w]}], lr=0.1)
    with pytest.raises(ValueError, match="RMSprop: lr must be >= 0"):
        opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(TypeError, match="RMSprop: centered must be True or False"):
        opt.param_groups[0]["centered"] = "yes"
    assert opt.lr == 0.1
    with pytest.raises(ValueError, match="OneCycleLR: give total_steps, or epochs and steps_per_epoch"):
        optim.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(ValueError, match="ReduceLROnPlateau: factor must be in"):
        optim.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="clip_grad_norm_: max_norm must be >= 0"):
        nn.utils.clip_grad_norm_([w], -1.0)


def test_switching_a_flag_retraces():
    w = Tensor(np.ones(2))
    opt = optim.SGD([w], lr=0.1, momentum=0.9)

    @mlir_nn.jit(backend="numpy", dynamic_batch=False)
    def step(x):
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()

    step(np.ones(2))
    first = step.lower(np.ones(2))
    opt.param_groups[0]["nesterov"] = True
    step(np.ones(2))
    assert step.lower(np.ones(2)) is not first
