"""Optimizer hyperparameters are run-time inputs of a compiled step: no recompile, no stale value."""

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.engine import Tensor
from mlir_nn.jit.feeds import FedTensor
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step

BACKENDS = ["numpy", "cpu"]


def twins(opt_cls, **opt_args):
    """An eager and a to-be-compiled (model, optimizer) pair with equal float64 weights."""
    models = [MLP(3, [6, 2], dtype=np.float64) for _ in range(2)]
    for a, b in zip(*(m.parameters() for m in models)):
        b.data[...] = a.data
    return [(m, opt_cls(m.parameters(), **opt_args)) for m in models]


def batches(n, rows=5, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, 3)), rng.standard_normal((rows, 2))) for _ in range(n)]


def assert_same_parameters(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(q.data, p.data, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_changed_learning_rate_takes_effect_without_recompiling(backend):
    model = MLP(2, [8, 1])
    opt = SGD(model.parameters(), lr=0.05)
    step = jit(train_step(model, opt), backend=backend)
    x, y = np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32)
    step(x, y)
    compiled = step.lower(x, y)
    opt.lr = 0.0
    before = [p.data.copy() for p in model.parameters()]
    step(x, y)
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, b)  # lr=1e-12 once still moved W by 7.8e-3
    opt.lr = 0.05
    step(x, y)
    assert not np.array_equal(model.parameters()[0].data, before[0])
    assert step.lower(x, y) is compiled and len(step._cache) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt_cls,changes", [
    (SGD, [{"lr": 0.1}, {"lr": 0.02, "momentum": 0.5}, {"momentum": 0.9, "weight_decay": 0.1},
           {"momentum": 0.0}, {"weight_decay": 0.0, "lr": 0.3}]),
    (Adam, [{"lr": 0.01}, {"betas": (0.5, 0.9)}, {"eps": 1e-3, "weight_decay": 0.2}, {"lr": 0.0},
            {"betas": (0.0, 0.0), "weight_decay": 0.0}]),
])
def test_hyperparameter_schedules_match_eager_steps(backend, opt_cls, changes):
    (eager_model, eager_opt), (model, opt) = twins(opt_cls, lr=0.05)
    eager, step = train_step(eager_model, eager_opt), jit(train_step(model, opt), backend=backend)
    for change, (x, y) in zip(changes, batches(len(changes))):
        for name, value in change.items():
            setattr(eager_opt, name, value)
            setattr(opt, name, value)
        loss = step(x, y)
        np.testing.assert_allclose(loss, eager(Tensor(x), Tensor(y)).data, rtol=1e-12)
        assert_same_parameters(eager_model, model)


def test_hyperparameters_are_zero_d_parameters_of_the_graph():
    model = MLP(2, [4, 1])
    opt = Adam(model.parameters(), lr=0.01)
    x, y = np.ones((3, 2), np.float32), np.ones((3, 1), np.float32)
    compiled = jit(train_step(model, opt), backend="numpy").lower(x, y)
    fed = [t for t in compiled.captured if isinstance(t, FedTensor)]
    assert sorted(t.label for t in fed) == ["Adam.betas[0]", "Adam.betas[1]", "Adam.eps", "Adam.lr"]
    assert all(t.shape == () and t.dtype == "float32" for t in fed)
    assert "0.01" not in compiled.as_text("tensor")  # no learning rate baked in as a constant


def test_the_update_still_folds_into_gemm_with_a_run_time_learning_rate():
    model = MLP(2, [32, 32, 1])
    opt = SGD(model.parameters(), lr=0.005)
    compiled = jit(train_step(model, opt)).lower(np.ones((100, 2), np.float32), np.ones((100, 1), np.float32))
    lr = compiled.graph.params[compiled.captured.index(opt._fed[(0, "lr", "float32")])]
    gemms = [n for n in compiled.optimized_graph.nodes if n.op == "gemm"]
    assert len(gemms) == 3 and all(g.inputs[3] == lr and g.attr("subtract") for g in gemms)
    assert compiled.optimize_report.kernels_after == 19


def test_fed_tensor_reads_its_source_on_refresh():
    value = {"x": 1.5}
    t = FedTensor(lambda: value["x"], "float32")
    buffer = t.data
    value["x"] = -2.0
    t.refresh()
    assert t.data is buffer and float(t.data) == -2.0
