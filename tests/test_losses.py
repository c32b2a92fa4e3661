"""Losses: cross-entropy against PyTorch (float64), on every backend, at extreme logits."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import DTypeError, ShapeError
from mlir_nn.losses import cross_entropy, l1_loss, mse_loss, nll_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step


def _targets(kind: str, n: int, c: int, rng) -> np.ndarray:
    return rng.integers(0, c, n).astype(np.float64) if kind == "labels" else rng.dirichlet(np.ones(c), n)


def _torch_loss_and_grad(z: np.ndarray, target: np.ndarray, kind: str) -> tuple[float, np.ndarray]:
    zt = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    tt = torch.tensor(target.astype(np.int64)) if kind == "labels" else torch.tensor(target)
    loss = torch.nn.functional.cross_entropy(zt, tt)
    loss.backward()
    return loss.item(), zt.grad.numpy()


@pytest.mark.parametrize("kind", ["labels", "probabilities"])
@pytest.mark.parametrize("n,c", [(1, 1), (1, 4), (7, 3), (33, 10)])
def test_cross_entropy_matches_pytorch_eager(kind, n, c):
    rng = np.random.default_rng(n * c)
    z, target = rng.standard_normal((n, c)) * 3, _targets(kind, n, c, rng)
    logits = Tensor(z)
    loss = cross_entropy(logits, target)
    loss.backward()
    want_loss, want_grad = _torch_loss_and_grad(z, target, kind)
    np.testing.assert_allclose(loss.data, want_loss, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(logits.grad, want_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("kind", ["labels", "probabilities"])
@pytest.mark.parametrize("backend,optimize", [("numpy", False), ("cpu", False), ("cpu", True)])
def test_cross_entropy_step_matches_pytorch_compiled(kind, backend, optimize):
    """A compiled float64 step's loss and logits gradient (through a linear layer's W update) vs PyTorch."""
    rng = np.random.default_rng(3)
    x, target = rng.standard_normal((9, 5)), _targets(kind, 9, 4, rng)
    w0 = rng.standard_normal((5, 4))
    w = Tensor(w0.copy())
    opt = SGD([w], lr=1.0)

    @mlir_nn.jit(backend=backend, optimize=optimize)
    def step(x, y):
        loss = cross_entropy(x @ w, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    loss = step(x, target)
    want_loss, want_grad = _torch_loss_and_grad(x @ w0, target, kind)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
    np.testing.assert_allclose(w.data, w0 - x.T @ want_grad, rtol=1e-10, atol=1e-12)
    if optimize:
        assert "softmax_xent_grad" in step.lower(x, target).optimized_graph.op_counts()


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_cross_entropy_is_finite_for_huge_logits(backend):
    z = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4], [1e4, 1e4, -1e4]], np.float32)
    labels = np.array([1.0, 2.0, 0.0], np.float32)
    w = Tensor(np.eye(3, dtype=np.float32))

    @mlir_nn.jit(backend=backend)
    def step(x, y):
        loss = cross_entropy(x @ w, y)
        w.grad = 0
        loss.backward()
        return loss, Tensor.softmax(x @ w, axis=1), (x @ w).log_softmax(axis=1)

    loss, softmax, log_softmax = step(z, labels)
    want_loss, _ = _torch_loss_and_grad(z.astype(np.float64), labels, "labels")
    assert np.isfinite(loss) and np.all(np.isfinite(softmax)) and np.all(np.isfinite(log_softmax))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(softmax.sum(axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "numpy", "cpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_softmax_stays_finite_at_the_ends_of_the_float_range(backend, dtype):
    """max - min overflows: log_softmax stops at the lowest finite value, the loss is 0, not NaN."""
    big = np.finfo(dtype).max * 0.9
    z = np.array([[big, -big], [-big, big]], dtype)

    def fn(x, y, row, label):
        return x.log_softmax(axis=1), cross_entropy(x, y), cross_entropy(row, label)

    run = (lambda *args: fn(*map(Tensor, args))) if backend == "eager" else mlir_nn.jit(fn, backend=backend)
    results = run(z, np.array([0, 1], dtype), z[:1], np.array([1], dtype))
    log_probs, right, wrong = (np.asarray(getattr(r, "data", r)) for r in results)
    np.testing.assert_array_equal(log_probs, [[0, np.finfo(dtype).min], [np.finfo(dtype).min, 0]])
    assert right == 0 and wrong == np.finfo(dtype).max


def test_softmax_and_max_lower_on_cpu_like_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(np.float32)

    def fn(x):
        return x.softmax(axis=0), x.log_softmax(axis=1), x.max(axis=1, keepdims=True), x.max()

    for got, want in zip(mlir_nn.jit(fn, backend="cpu")(x), mlir_nn.jit(fn, backend="numpy")(x)):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_mlp_classifier_step_is_the_same_on_cpu_and_numpy():
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((33, 4)).astype(np.float32), rng.integers(0, 3, 33).astype(np.float32)
    results = []
    for backend in ("numpy", "cpu"):
        np.random.seed(0)
        model = MLP(4, [8, 3])
        step = mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1), cross_entropy), backend=backend)
        losses = [float(step(X[:b], y[:b])) for b in (33, 1, 7)]
        results.append((losses, [p.data.copy() for p in model.parameters()]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=2e-5)
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("logits,target,match", [
    (np.ones(3), [0], r"cross_entropy: logits must have shape \(batch, classes\), got \(3,\)"),
    (np.ones((2, 3)), [0, 1, 2], r"cross_entropy: labels \(3,\) do not match logits \(2, 3\)"),
    (np.ones((2, 3)), np.ones((2, 4)), r"cross_entropy: target \(2, 4\) does not match logits \(2, 3\)"),
])
def test_cross_entropy_bad_shapes(logits, target, match):
    with pytest.raises(ShapeError, match=match):
        cross_entropy(Tensor(logits), target)


def test_cross_entropy_rejects_labels_out_of_range():
    with pytest.raises(ValueError, match=r"one_hot: labels must be integers in \[0, 3\)"):
        cross_entropy(Tensor(np.ones((2, 3))), [0, 3])


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_compiled_step_refuses_bad_labels_and_writes_nothing(backend):
    np.random.seed(0)
    model = MLP(4, [5, 3])
    step = mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1), cross_entropy), backend=backend)
    x = np.ones((3, 4), np.float32)
    step(x, np.array([0, 1, 2], np.float32))
    before = [p.data.copy() for p in model.parameters()]
    for bad in (3.0, -1.0, 0.5, 1e9, -0.25):
        with pytest.raises(ValueError, match=r"one_hot: labels must be integers in \[0, 3\), got \[" + repr(bad)):
            step(x, np.array([0, bad, 2], np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        step(x, np.array([0, np.nan, 2], np.float32))
    for a, b in zip(before, model.parameters()):
        np.testing.assert_array_equal(a, b.data)
    assert np.isfinite(step(x, np.array([2, 2, 0], np.float32)))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("loss,target,match", [
    (cross_entropy, np.array([0.0, 2.0]), "cross_entropy: the target is float64, the logits float32; pass class "
                                          r"labels as integers \(np.int64\) or the target as float32"),
    (cross_entropy, np.full((2, 3), 1 / 3), "cross_entropy: the target is float64, the logits float32"),
    (nll_loss, np.array([0.0, 2.0]), "nll_loss: the target is float64, the input float32"),
    (mse_loss, np.zeros((2, 3)), "mse_loss: the target is float64, the input float32; pass the target as float32"),
    (l1_loss, np.zeros((2, 3)), "l1_loss: the target is float64, the input float32"),
])
def test_a_step_argument_of_another_dtype_is_refused_in_the_losss_words(backend, loss, target, match):
    """A float64 target beside float32 predictions was refused by an op the user never called
    (``mul: operands have different dtypes``); eager code casts an array, a step argument keeps its dtype."""
    model = MLP(4, [3])
    step = mlir_nn.jit(lambda x, y: loss(model(x), y), backend=backend)
    with pytest.raises(DTypeError, match=match):
        step(np.ones((2, 4), np.float32), target)
    assert np.isfinite(float(loss(model(Tensor(np.ones((2, 4), np.float32))), target).data))  # eager: cast


def max_softmax_step(w: Tensor):
    """A step whose gradient runs through max (its eq mask and tie count) and softmax."""
    opt = SGD([w], lr=0.5)

    def step(x, y):
        z = x @ w
        loss = z.max(axis=1).mean() + ((z.softmax(axis=1) - y) ** 2.0).mean() + z.max() * 0.1
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def test_max_and_softmax_gradients_compile_on_cpu():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((9, 4)).astype(np.float32), rng.uniform(0, 1, (9, 3)).astype(np.float32)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    results = []
    for backend in ("numpy", "cpu"):
        w = Tensor(w0.copy())
        step = mlir_nn.jit(max_softmax_step(w), backend=backend)
        results.append(([float(step(x[:b], y[:b])) for b in (9, 1, 5)], w.data.copy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=2e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=2e-5, atol=1e-6)
    assert not np.allclose(results[0][1], w0)
