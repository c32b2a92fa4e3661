"""Conv2d and the pooling layers: PyTorch's state_dict keys and init bounds, and a small CNN's
training steps (eager, jit on numpy and cpu) equal PyTorch's in float64."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn.losses import cross_entropy
from mlir_nn.nn import AdaptiveAvgPool2d, AvgPool2d, Conv2d, Layer, MaxPool2d
from mlir_nn.optim import SGD


def test_conv2d_state_dict_keys_shapes_and_init_bounds_match_pytorch():
    ours, theirs = Conv2d(4, 6, (3, 2), groups=2), torch.nn.Conv2d(4, 6, (3, 2), groups=2)
    state = ours.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    bound = 1 / np.sqrt(2 * 3 * 2)
    assert np.all(np.abs(state["weight"]) <= bound) and np.abs(state["weight"]).max() > bound / 2
    assert list(Conv2d(1, 2, 3, bias=False).state_dict()) == ["weight"]
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 4, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(ours(x).data, theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_layer_arguments_are_checked():
    with pytest.raises(ValueError, match="groups=3 must divide"):
        Conv2d(4, 6, 3, groups=3)
    with pytest.raises(NotImplementedError, match="padding_mode"):
        Conv2d(1, 1, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="kernel_size"):
        Conv2d(1, 1, 0)


class SmallCnn(mlir_nn.nn.Module):
    def __init__(self):
        self.conv1 = Conv2d(1, 4, 3, padding=1, dtype=np.float64)
        self.pool1 = MaxPool2d(2)
        self.conv2 = Conv2d(4, 6, 3, padding="same", dtype=np.float64)
        self.pool2 = AvgPool2d(2, stride=1)
        self.gap = AdaptiveAvgPool2d((2, 1))
        self.fc = Layer(12, 3, nonlin=False, dtype=np.float64)

    def __call__(self, x):
        h = self.pool1(self.conv1(x).relu())
        h = self.gap(self.pool2(self.conv2(h).relu()))
        return self.fc(h.reshape(h.shape[0], 12))

    def parameters(self):
        return self.conv1.parameters() + self.conv2.parameters() + self.fc.parameters()


def torch_twin(model):
    twin = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(4, 6, 3, padding="same"), torch.nn.ReLU(),
                               torch.nn.AvgPool2d(2, stride=1), torch.nn.AdaptiveAvgPool2d((2, 1)),
                               torch.nn.Flatten(), torch.nn.Linear(12, 3)).double()
    ps = [p.data.copy() for p in model.parameters()]
    ps[-2] = ps[-2].T  # tinynn's Layer.W is (in, out)
    with torch.no_grad():
        for p, value in zip(twin.parameters(), ps):
            p.copy_(torch.from_numpy(value))
    return twin


@pytest.mark.parametrize("backend", ["eager", "numpy", "cpu"])
def test_small_cnn_steps_equal_pytorch_in_float64(backend):
    np.random.seed(0)
    model = SmallCnn()
    twin = torch_twin(model)
    opt, topt = SGD(model.parameters(), lr=0.1, momentum=0.9), torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        loss = cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = step if backend == "eager" else mlir_nn.jit(step, backend=backend, tiered=False)
    rng = np.random.default_rng(1)
    for batch in (5, 1, 3):
        x, y = rng.standard_normal((batch, 1, 7, 9)), rng.integers(0, 3, batch).astype(np.float64)
        loss = run(x, y)
        tloss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y).long())
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert abs(float(loss.item() if hasattr(loss, "item") else loss) - tloss.item()) < 1e-10
    ps = [p.data for p in model.parameters()]
    ps[-2] = ps[-2].T
    for ours, theirs in zip(ps, twin.parameters()):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-10, atol=1e-10)
