"""LayerNorm and BatchNorm1d against PyTorch in float64: outputs, gradients, running statistics."""

import numpy as np
import pytest
import torch

from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from tests.nn.torch_twin import TOL, assert_same_as_torch


def randomize(module):
    """Random affine parameters (PyTorch starts them at ones and zeros, which hides mistakes)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape))
    return module


@pytest.mark.parametrize("shape,normalized,options", [
    ((1, 5), 5, {}), ((4, 5), (5,), {}), ((2, 3, 4), (3, 4), {}), ((3, 6), 6, {"bias": False}),
    ((3, 6), 6, {"elementwise_affine": False}), ((2, 4), 4, {"eps": 0.1}),
])
def test_layer_norm_equals_pytorch(shape, normalized, options):
    ours = nn.LayerNorm(normalized, dtype=np.float64, **options)
    theirs = randomize(torch.nn.LayerNorm(normalized, **options))
    assert_same_as_torch(ours, theirs, np.random.randn(*shape) * 2 + 1)


@pytest.mark.parametrize("shape,options", [
    ((6, 4), {}), ((2, 3), {"momentum": 0.3}), ((5, 3, 7), {}), ((4, 2, 1), {"momentum": None}),
    ((3, 5), {"affine": False}), ((4, 3), {"track_running_stats": False}), ((1, 3, 4), {"eps": 1e-3}),
])
def test_batch_norm_training_then_eval_equals_pytorch(shape, options):
    ours = nn.BatchNorm1d(shape[1], dtype=np.float64, **options)
    theirs = randomize(torch.nn.BatchNorm1d(shape[1], **options))
    rng = np.random.default_rng(0)
    for _ in range(3):  # training: batch statistics, running ones move
        out = assert_same_as_torch(ours, theirs, rng.standard_normal(shape) * 3 + 2)
        ours.zero_grad()
        theirs.zero_grad()
    assert out.shape == shape
    state = theirs.state_dict()
    assert list(ours.state_dict()) == list(state)
    for key, value in ours.state_dict().items():
        np.testing.assert_allclose(value, state[key].numpy(), **TOL, err_msg=key)
    ours.eval()
    theirs.eval()
    tracked = options.get("track_running_stats", True)
    x = rng.standard_normal((1 if tracked else 2,) + shape[1:])  # batch 1 is fine when running stats are used
    np.testing.assert_allclose(ours(x).data, theirs(torch.tensor(x)).detach().numpy(), **TOL)


def test_batch_norm_rejects_what_pytorch_rejects():
    bn = nn.BatchNorm1d(3, dtype=np.float64)
    with pytest.raises(ValueError, match=r"expected more than 1 value per channel when training, got input \(1, 3\)"):
        bn(np.ones((1, 3)))
    with pytest.raises(ShapeError, match=r"batch_norm: running_mean has shape \(3,\), expected \(4,\)"):
        bn(np.ones((2, 4)))
    with pytest.raises(ShapeError, match=r"batch_norm: input has shape \(2, 3, 4, 5\), expected \(N, C\)"):
        bn(np.ones((2, 3, 4, 5)))
    with pytest.raises(ShapeError, match=r"layer_norm: input has shape \(2, 3\), expected it to end with \(4,\)"):
        nn.LayerNorm(4)(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="BatchNorm1d: num_features must be a positive int, got 0"):
        nn.BatchNorm1d(0)
    assert bn.running_mean.data.tolist() == [0, 0, 0] and bn.num_batches_tracked.data == 0  # nothing written


def test_buffers_are_state_not_parameters():
    bn = nn.BatchNorm1d(2)
    assert [n for n, _ in bn.named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    assert isinstance(bn.running_mean, Tensor) and not isinstance(bn.running_mean, nn.Parameter)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_compiled_batch_norm_step_refuses_a_batch_of_one(backend):
    """Traced for any batch, BatchNorm1d in training needs two rows: a batch of one is an error
    before the step runs (no NaN in running_var), and the step still runs at batch 2."""
    import mlir_nn
    from mlir_nn.optim import SGD

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = SGD(model.parameters(), lr=0.1)

    @mlir_nn.jit(backend=backend)
    def step(x):
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    step(np.ones((5, 3), np.float32))
    before = model.state_dict()
    with pytest.raises(ValueError, match="expected a batch of at least 2, got 1"):
        step(np.ones((1, 3), np.float32))
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert np.isfinite(float(step(np.random.randn(2, 3).astype(np.float32))))


@pytest.mark.parametrize("entry,value,match", [
    ("1.running_var", np.array([1.0, -0.5, 1.0, 1.0]), "1.running_var must hold numbers >= 0; it has -0.5"),
    ("1.num_batches_tracked", np.array(-1.0), r"1.num_batches_tracked must hold a whole number >= 0 \(a count\)"),
    ("1.num_batches_tracked", np.array(2.5), "it has 2.5"),
])
def test_batch_norm_statistics_outside_their_domain_are_refused_and_change_nothing(entry, value, match):
    """A negative running variance is NaN in eval mode (the square root of a negative); a count of
    -1 divides by zero in the cumulative average (momentum None)."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=None))
    before = model.state_dict()
    with pytest.raises(ValueError, match=match):
        model.load_state_dict({**before, "0.bias": np.ones(4), entry: value})
    for key, array in model.state_dict().items():
        np.testing.assert_array_equal(array, before[key])
