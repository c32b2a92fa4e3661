"""LR schedules: PyTorch's sequences, state dicts, and the learning rate the optimizer uses."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn.engine import Tensor
from mlir_nn.nn import MLP
from mlir_nn.optim import (
    SGD,
    Adam,
    CosineAnnealingLR,
    ExponentialLR,
    LambdaLR,
    OneCycleLR,
    ReduceLROnPlateau,
    StepLR,
)
from mlir_nn.trainer import train_step

SCHEDULES = {
    "StepLR": (StepLR, torch.optim.lr_scheduler.StepLR, dict(step_size=3, gamma=0.5)),
    "ExponentialLR": (ExponentialLR, torch.optim.lr_scheduler.ExponentialLR, dict(gamma=0.9)),
    "CosineAnnealingLR": (CosineAnnealingLR, torch.optim.lr_scheduler.CosineAnnealingLR, dict(T_max=7, eta_min=0.01)),
    "LambdaLR": (LambdaLR, torch.optim.lr_scheduler.LambdaLR, dict(lr_lambda=lambda e: 1 / (1 + e))),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_sequences_match_pytorch(name):
    ours_cls, torch_cls, kwargs = SCHEDULES[name]
    opt = SGD([Tensor(np.zeros(2))], lr=0.2)
    ours = ours_cls(opt, **kwargs)
    torch_opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.2)
    theirs = torch_cls(torch_opt, **kwargs)
    for _ in range(20):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=1e-15)
        assert opt.lr == ours.get_last_lr()[0]
        torch_opt.step()
        ours.step()
        theirs.step()


def test_state_dict_round_trip_resumes_the_sequence(tmp_path):
    opt = SGD([Tensor(np.zeros(2))], lr=0.2)
    schedule = CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        schedule.step()
    mlir_nn.save(schedule.state_dict(), tmp_path / "s.npz")
    expected = [(schedule.step(), opt.lr)[1] for _ in range(3)]

    fresh_opt = SGD([Tensor(np.zeros(2))], lr=0.2)
    fresh = CosineAnnealingLR(fresh_opt, T_max=10)
    fresh.load_state_dict(mlir_nn.load(tmp_path / "s.npz"))
    assert [(fresh.step(), fresh_opt.lr)[1] for _ in range(3)] == expected
    assert "lr_lambda" not in LambdaLR(fresh_opt, lambda e: 1.0).state_dict()  # functions are code: not saved


def test_the_eager_optimizer_uses_the_scheduled_lr():
    w = Tensor(np.array([1.0, -2.0]))
    opt = SGD([w], lr=0.1)
    schedule = StepLR(opt, step_size=1, gamma=0.1)
    lrs = []
    for _ in range(3):
        before = w.data.copy()
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
        lrs.append(float(np.mean((before - w.data) / (2 * before))))
        schedule.step()
    np.testing.assert_allclose(lrs, [0.1, 0.01, 0.001], rtol=1e-9)


@pytest.mark.parametrize("build,error,match", [
    (lambda o: StepLR(o, step_size=0), ValueError, "StepLR: step_size must be a positive integer"),
    (lambda o: CosineAnnealingLR(o, T_max=0), ValueError, "CosineAnnealingLR: T_max must be positive"),
    (lambda o: LambdaLR(o, 0.5), TypeError, "LambdaLR: lr_lambda must be callable"),
    (lambda o: ExponentialLR(o, 0.9, last_epoch=3), KeyError, "needs 'initial_lr' in every parameter group"),
])
def test_bad_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build(SGD([Tensor(np.zeros(2))], lr=0.1))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("opt_cls,schedule", [
    (SGD, lambda o: StepLR(o, step_size=2, gamma=0.3)),
    (Adam, lambda o: CosineAnnealingLR(o, T_max=5)),  # reaches lr = 0 at epoch 5
])
def test_a_schedule_changes_the_lr_of_a_compiled_step_without_recompiling(backend, opt_cls, schedule):
    models = [MLP(3, [6, 2], dtype=np.float64) for _ in range(2)]
    for a, b in zip(*(m.parameters() for m in models)):
        b.data[...] = a.data
    opts = [opt_cls(m.parameters(), lr=0.05) for m in models]
    schedules = [schedule(o) for o in opts]
    eager = train_step(models[0], opts[0])
    step = mlir_nn.jit(train_step(models[1], opts[1]), backend=backend)
    rng = np.random.default_rng(0)
    lrs = []
    for _ in range(7):
        x, y = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
        np.testing.assert_allclose(step(x, y), eager(Tensor(x), Tensor(y)).data, rtol=1e-12)
        for p, q in zip(models[0].parameters(), models[1].parameters()):
            np.testing.assert_allclose(q.data, p.data, rtol=1e-12, atol=1e-15)
        lrs.append(opts[1].lr)
        for s in schedules:
            s.step()
    assert len(set(lrs)) >= 4  # the learning rate really moved
    assert len(step._cache) == 1  # one trace and compile served every learning rate


RESUMABLE = {
    "StepLR": lambda opt: StepLR(opt, step_size=2),
    "CosineAnnealingLR": lambda opt: CosineAnnealingLR(opt, T_max=10),
    "OneCycleLR": lambda opt: OneCycleLR(opt, max_lr=0.5, total_steps=10),
    "ReduceLROnPlateau": lambda opt: ReduceLROnPlateau(opt, patience=0),
}


def _stepped(name):
    opt = SGD([Tensor(np.zeros(2))], lr=0.2, momentum=0.9)
    schedule = RESUMABLE[name](opt)
    for _ in range(3):
        schedule.step(1.0) if name == "ReduceLROnPlateau" else schedule.step()
    return opt, schedule


@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_every_schedule_resumes_from_a_checkpoint_file(name, tmp_path):
    """Through the file, tuples come back as lists and are accepted as the schedule's own."""
    opt, schedule = _stepped(name)
    mlir_nn.save(schedule.state_dict(), tmp_path / "s.npz")
    fresh_opt, fresh = _stepped(name)
    fresh.load_state_dict(mlir_nn.load(tmp_path / "s.npz"))
    assert fresh.state_dict() == schedule.state_dict()


BAD_SCHEDULE_STATES = [
    ("StepLR", {"optimizer": {}}, "has unknown optimizer; a checkpoint of another schedule"),
    ("StepLR", {"T_max": 10}, "has unknown T_max"),
    ("CosineAnnealingLR", {"T_max": None}, r"T_max is None; expected an integer"),
    ("StepLR", {"gamma": float("nan")}, "gamma is nan; expected a number"),
    ("StepLR", {"last_epoch": "x"}, "last_epoch is 'x'; expected an integer"),
    ("StepLR", {"last_epoch": -7}, "last_epoch must be >= -1"),
    ("StepLR", {"base_lrs": [0.1, 0.2]}, r"base_lrs is \[0.1, 0.2\]; expected a list of 1"),
    ("StepLR", {"base_lrs": [-0.1]}, "base_lrs must hold finite learning rates >= 0"),
    ("OneCycleLR", {"_phases": [[2.0, "initial_lr", "max_lr", "max_momentum", "oops"], [9, "max_lr", "min_lr",
                                                                                     "base_momentum", "max_momentum"]]},
     r"_phases\[0\]\[4\] is 'oops'"),
    ("ReduceLROnPlateau", {"mode": "sideways"}, "mode is 'sideways'; expected 'min'"),
    ("ReduceLROnPlateau", {"min_lrs": [float("inf")]}, "min_lrs must hold finite learning rates"),
    # settings outside the constructor's ranges: a period of 0 divided by zero at the next step
    ("StepLR", {"step_size": 0}, r"step_size must be a number > 0, got 0"),
    ("CosineAnnealingLR", {"T_max": 0}, r"T_max must be a number > 0, got 0"),
    ("OneCycleLR", {"total_steps": -1}, r"total_steps must be a number > 0, got -1"),
    ("ReduceLROnPlateau", {"factor": 2.0}, r"factor must be a number in \[0, 1\), got 2.0"),
    ("ReduceLROnPlateau", {"patience": -1}, r"patience must be a number >= 0, got -1"),
]


@pytest.mark.parametrize("name,change,match", BAD_SCHEDULE_STATES)
def test_a_bad_schedule_state_is_refused_and_changes_nothing(name, change, match):
    """It was written as given (the optimizer reference included): later steps failed or
    divided by zero, or a list of the wrong length was silently cut."""
    opt, schedule = _stepped(name)
    before = schedule.state_dict()
    with pytest.raises(ValueError, match=match):
        schedule.load_state_dict({**before, **change})
    assert schedule.state_dict() == before and schedule.optimizer is opt
