"""Conv2d, pooling, BatchNorm2d and Dropout2d: PyTorch's state_dict keys and init bounds, PyTorch
weights loaded directly, and a small CNN's training steps (eager, jit on numpy and cpu) equal
PyTorch's in float64."""

import numpy as np
import pytest
import torch

import mlir_nn
import mlir_nn.optim
from mlir_nn import nn
from mlir_nn.ir import ShapeError
from mlir_nn.losses import cross_entropy


def _training_step(model, opt):
    """One cross-entropy training step of ``model`` with ``opt``, returning the loss."""
    def step(x, y):
        loss = cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def _steps_equal_torch(run, model, twin, topt, data) -> None:
    """Training steps ``run`` on each (x, y) of ``data`` and PyTorch's on its ``twin``: equal losses
    and, at the end, equal parameters (float64, 1e-10)."""
    for x, y in data:
        loss = run(x, y)
        tloss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y).long())
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert abs(float(loss.item()) - tloss.item()) < 1e-10
    theirs = twin.state_dict()
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, theirs[name].numpy(), rtol=1e-10, atol=1e-10, err_msg=name)


def test_conv2d_state_dict_keys_shapes_and_init_bounds_match_pytorch():
    ours, theirs = nn.Conv2d(4, 6, (3, 2), groups=2), torch.nn.Conv2d(4, 6, (3, 2), groups=2)
    state = ours.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    bound = 1 / np.sqrt(2 * 3 * 2)
    for name in ("weight", "bias"):
        assert np.all(np.abs(state[name]) <= bound) and np.abs(state[name]).max() > bound / 2, name
    assert list(nn.Conv2d(1, 2, 3, bias=False).state_dict()) == ["weight"]
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 4, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(ours(x).data, theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_layer_arguments_are_checked():
    with pytest.raises(ValueError, match="groups=3 must divide"):
        nn.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(NotImplementedError, match="padding_mode"):
        nn.Conv2d(1, 1, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="kernel_size"):
        nn.Conv2d(1, 1, 0)
    with pytest.raises(ShapeError, match=r"BatchNorm2d: input has shape \(2, 3\)"):
        nn.BatchNorm2d(3)(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="Dropout2d: probability"):
        nn.Dropout2d(1.5)


def small_cnn(lib, dtype=None):
    """The same network in mlir_nn.nn or torch.nn (equal state_dict keys)."""
    kw = {} if dtype is None else {"dtype": dtype}
    return lib.Sequential(lib.Conv2d(1, 4, 3, padding=1, **kw), lib.BatchNorm2d(4, **kw), lib.ReLU(),
                          lib.MaxPool2d(2), lib.Conv2d(4, 6, 3, padding="same", **kw), lib.ReLU(),
                          lib.AvgPool2d(2, stride=1), lib.AdaptiveAvgPool2d((2, 1)), lib.Flatten(),
                          lib.Linear(12, 3, **kw))


@pytest.mark.parametrize("backend,optimizer", [("eager", "SGD"), ("numpy", "SGD"), ("cpu", "SGD"), ("cpu", "Adam")])
def test_small_cnn_steps_equal_pytorch_in_float64(backend, optimizer):
    twin = small_cnn(torch.nn).double()
    model = small_cnn(nn, np.float64)
    model.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})  # PyTorch's weights
    kw = dict(lr=0.1, momentum=0.9) if optimizer == "SGD" else dict(lr=0.01, weight_decay=0.01)
    opt = getattr(mlir_nn.optim, optimizer)(model.parameters(), **kw)
    topt = getattr(torch.optim, optimizer)(twin.parameters(), **kw)

    step = _training_step(model, opt)
    run = step if backend == "eager" else mlir_nn.jit(step, backend=backend, tiered=False)
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((b, 1, 7, 9)), rng.integers(0, 3, b).astype(np.float64)) for b in (5, 2, 3)]
    _steps_equal_torch(run, model, twin, topt, data)
    model.eval()
    twin.eval()
    x = rng.standard_normal((2, 1, 7, 9))
    np.testing.assert_allclose(model(x).data, twin(torch.from_numpy(x)).detach().numpy(), rtol=1e-10, atol=1e-10)


def test_dropout2d_zeroes_whole_channels_in_training_only():
    mlir_nn.manual_seed(0)
    drop = nn.Dropout2d(0.25)
    x = np.random.default_rng(0).uniform(1, 2, (16, 32, 3, 3))
    y = drop(x).data
    kept = (y != 0).reshape(16, 32, 9)
    assert np.all(kept.all(axis=2) | ~kept.any(axis=2))  # a channel is kept or dropped whole
    np.testing.assert_allclose(y[y != 0], (x / 0.75)[y != 0])
    assert 0.15 < 1 - kept[:, :, 0].mean() < 0.35
    drop.eval()
    np.testing.assert_array_equal(drop(x).data, x)
    drop.train()
    y = drop(x[0]).data  # (C, H, W) is (N, C, L) to PyTorch: one draw per row of L
    rows = (y != 0).reshape(32, 3, 3)
    assert np.all(rows.all(axis=2) | ~rows.any(axis=2)) and not np.all(rows.all(axis=(1, 2)) | ~rows.any(axis=(1, 2)))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_compiled_dropout2d_masks_and_gradients_equal_eager_ones(backend):
    """Inside a compiled step Dropout2d draws the eager masks (same seed), fresh on each call and at
    any batch; the gradient of a dropped channel is zero, that of a kept one scaled by 1/(1 - p)."""
    model = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1, dtype=np.float64), nn.Dropout2d(0.4))

    def step(x):
        y = model(x)
        model.zero_grad()
        (y * y).sum().backward()
        return y

    run = mlir_nn.jit(lambda x: (step(x), model[0].weight.grad)[1], backend=backend, tiered=False)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((b, 2, 5, 4)) for b in (4, 1, 4)]
    mlir_nn.manual_seed(7)
    compiled = [np.array(run(x)) for x in xs]
    mlir_nn.manual_seed(7)
    for x, got in zip(xs, compiled):
        y = step(x).data
        kept = (y != 0).reshape(y.shape[0], 6, -1).any(axis=2)
        assert not kept.all() and kept.any()
        np.testing.assert_allclose(got, model[0].weight.grad, rtol=1e-12, atol=1e-12)
    assert not np.allclose(compiled[0], compiled[2])  # a fresh mask per call


@pytest.mark.parametrize("bias", [True, False])
def test_eval_mode_conv_batchnorm_relu_is_folded_and_equals_pytorch_in_float64(bias):
    """In eval mode the optimizer folds BatchNorm2d into the convolution before it (weights
    scaled, bias shifted) and the ReLU into its epilogue: one conv2d_bias, no per-activation
    normalization, PyTorch's result."""
    def net(lib, **kw):
        return lib.Sequential(lib.Conv2d(3, 5, 3, padding=1, stride=2, bias=bias, **kw), lib.BatchNorm2d(5, **kw),
                              lib.ReLU())

    twin = net(torch.nn).double()
    rng = np.random.default_rng(3)
    with torch.no_grad():
        twin[1].running_mean.copy_(torch.from_numpy(rng.standard_normal(5)))
        twin[1].running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, 5)))
        twin[1].weight.copy_(torch.from_numpy(rng.standard_normal(5)))
        twin[1].bias.copy_(torch.from_numpy(rng.standard_normal(5)))
    model = net(nn, dtype=np.float64)
    model.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})
    model.eval()
    twin.eval()
    run = mlir_nn.jit(lambda x: model(x), backend="cpu", tiered=False)
    x = rng.standard_normal((4, 3, 9, 8))
    optimized = run.lower(x).optimized_graph
    assert [n.attr("activation") for n in optimized.nodes if n.op == "conv2d_bias"] == ["relu"]
    assert all(n.shape == (5,) for n in optimized.nodes if n.op in ("sqrt", "div"))
    for batch in (4, 1):
        np.testing.assert_allclose(run(x[:batch]).data, twin(torch.from_numpy(x[:batch])).detach().numpy(),
                                   rtol=1e-10, atol=1e-10)


def lenet(lib, channels, dtype=None):
    """LeNet-5's layout (5x5 convolutions, 2x2 max pools over tiling windows, as in the benchmark)."""
    kw = {} if dtype is None else {"dtype": dtype}
    return lib.Sequential(lib.Conv2d(channels, 6, 5, padding=2, **kw), lib.ReLU(), lib.MaxPool2d(2),
                          lib.Conv2d(6, 5, 5, **kw), lib.ReLU(), lib.MaxPool2d(2), lib.Flatten(),
                          lib.Linear(5 * 5 * 5, 10, **kw))


@pytest.mark.parametrize("channels,batches", [(1, (7, 1, 7)), (3, (2, 3))])
def test_lenet_steps_with_tiling_max_pools_equal_pytorch_in_float64(channels, batches):
    """The pools whose windows tile their input (compare-and-select maxima, argmax positions from
    constant offsets) in whole compiled training steps, against PyTorch over several steps."""
    twin = lenet(torch.nn, channels).double()
    model = lenet(nn, channels, np.float64)
    model.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})
    opt = mlir_nn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    topt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)

    step = _training_step(model, opt)
    run = mlir_nn.jit(step, tiered=False)
    rng = np.random.default_rng(2)
    data = [(rng.standard_normal((b, channels, 28, 28)), rng.integers(0, 10, b).astype(np.float64)) for b in batches]
    _steps_equal_torch(run, model, twin, topt, data)


def vgg(lib, dtype=None):
    """VGG-small's layout (3x3 convolutions with padding 1, each with ReLU and a 2x2 max pool)."""
    kw = {} if dtype is None else {"dtype": dtype}
    return lib.Sequential(lib.Conv2d(3, 16, 3, padding=1, **kw), lib.ReLU(), lib.MaxPool2d(2),
                          lib.Conv2d(16, 32, 3, padding=1, **kw), lib.ReLU(), lib.MaxPool2d(2),
                          lib.Conv2d(32, 32, 3, padding=1, **kw), lib.ReLU(), lib.MaxPool2d(2), lib.Flatten(),
                          lib.Linear(32 * 4 * 4, 10, **kw))


def test_vgg_inference_runs_nhwc_between_two_transposes_and_equals_pytorch_in_float64():
    """Without a backward pass to read NCHW activations, the layout rules' NHWC program is the
    cheapest: VGG-small's forward from its second convolution on runs NHWC, one transpose in and
    one out; the result equals PyTorch's."""
    twin = vgg(torch.nn).double()
    model = vgg(nn, np.float64)
    model.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})
    run = mlir_nn.jit(lambda x: model(x), tiered=False)
    x = np.random.default_rng(4).standard_normal((16, 3, 32, 32))
    nodes = run.lower(x).optimized_graph.nodes
    # the first convolution's 3 input channels: its tap sum in NCHW beats a transpose and NHWC
    assert [n.attr_dict.get("layout") for n in nodes if n.op in ("conv2d_bias", "max_pool2d")] == \
        [None, None] + ["NHWC"] * 4
    assert [n.attr("perm") for n in nodes if n.op == "transpose"] == [(0, 2, 3, 1), (0, 3, 1, 2)]
    for batch in (16, 1):
        np.testing.assert_allclose(run(x[:batch]).data, twin(torch.from_numpy(x[:batch])).detach().numpy(),
                                   rtol=1e-10, atol=1e-10)


def test_vgg_training_steps_run_nhwc_and_equal_pytorch_in_float64():
    """A training step's backward reads its activations in NHWC too (the input and weight gradients,
    the pools' argmax and routing): the layout rules run VGG-small's convolutions, pools and their
    gradients in NHWC, and several steps still equal PyTorch's."""
    twin = vgg(torch.nn).double()
    model = vgg(nn, np.float64)
    model.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})
    opt = mlir_nn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    topt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.9)
    run = mlir_nn.jit(_training_step(model, opt), tiered=False)
    rng = np.random.default_rng(5)
    data = [(rng.standard_normal((b, 3, 32, 32)), rng.integers(0, 10, b).astype(np.float64)) for b in (16, 16, 5)]
    nhwc = {n.op for n in run.lower(*data[0]).optimized_graph.nodes if n.attr_dict.get("layout") == "NHWC"}
    assert {"conv2d_bias", "max_pool2d", "conv2d_input_grad", "max_pool2d_index", "max_pool2d_grad",
            "conv2d_weight_update"} <= nhwc, nhwc
    _steps_equal_torch(run, model, twin, topt, data)
