"""nn.Module: registration, walking, modes, state dicts (PyTorch's keys), structure guards."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn
from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.losses import mse_loss
from mlir_nn.optim import SGD


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(np.ones(3))
        self.body = nn.Sequential(nn.Linear(2, 3, dtype=np.float64), nn.Identity())
        self.head = nn.Linear(3, 1, bias=False, dtype=np.float64)
        self.register_buffer("seen", Tensor(np.zeros(1)))
        self.width = 3

    def forward(self, x):
        return self.head(self.body(x) * self.scale)


def test_attributes_are_registered_in_order():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["scale", "body.0.weight", "body.0.bias", "head.weight"]
    assert [n for n, _ in net.named_buffers()] == ["seen"]
    assert [n for n, _ in net.named_children()] == ["body", "head"]
    assert [n for n, _ in net.named_modules()] == ["", "body", "body.0", "body.1", "head"]
    assert net.children() == [net.body, net.head] and net.modules()[0] is net
    assert net.head.bias is None and isinstance(net.scale, nn.Parameter)
    assert len(net.parameters()) == 4 and net.buffers() == [net.seen]
    assert list(net.state_dict()) == ["scale", "seen", "body.0.weight", "body.0.bias", "head.weight"]
    assert net(np.ones((5, 2))).shape == (5, 1)


def test_reassigning_and_deleting():
    net = Net()
    net.head = nn.Linear(3, 2, dtype=np.float64)  # replaced in place: the order stays
    assert [n for n, _ in net.named_children()] == ["body", "head"]
    net.scale = Tensor(np.full(3, 2.0))  # a plain tensor replacing a parameter (tinynn's layer.W = ...)
    assert net.named_parameters()[0][1] is net.scale
    del net.head
    assert [n for n, _ in net.named_children()] == ["body"] and not hasattr(net, "head")
    net.seen = Tensor(np.ones(1))  # a buffer stays a buffer
    assert net.buffers() == [net.seen]
    with pytest.raises(TypeError, match="Net: cannot assign int as buffer 'seen'"):
        net.seen = 3
    with pytest.raises(AttributeError, match="'Net' object has no attribute 'nothing'"):
        _ = net.nothing


def test_shared_parameters_and_modules_count_once():
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    assert len(model.parameters()) == 2 and list(model.state_dict()) == ["0.weight", "0.bias"]


def test_a_subclass_without_super_init_and_a_plain_list_of_layers_still_register():
    class Forgetful(nn.Module):
        def __init__(self):
            self.layers = [nn.Linear(2, 3), nn.Linear(3, 1)]  # a plain list: PyTorch would lose these

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = Forgetful()
    assert [n for n, _ in model.named_parameters()] == ["layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                        "layers.1.bias"]
    assert not model.structure_tracked()  # list changes are not reported: checked on every call
    assert nn.Sequential(nn.Linear(2, 3)).structure_tracked()


def test_an_optimizer_over_no_parameters_is_an_error():
    class Empty(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = Tensor(np.ones(2))  # a plain tensor is not a parameter (as PyTorch)

        def forward(self, x):
            return x * self.w

    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        SGD(Empty().parameters(), lr=0.1)


def test_train_eval_apply_zero_grad_and_to():
    net = Net()
    assert net.training and net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(TypeError, match="mode must be a bool"):
        net.train("no")
    visited = []
    net.apply(lambda m: visited.append(type(m).__name__))
    assert visited == ["Linear", "Identity", "Sequential", "Linear", "Net"]
    mse_loss(net(np.ones((2, 2))), np.zeros((2, 1))).backward()
    assert np.any(net.head.weight.grad != 0)
    net.zero_grad()
    assert all(np.all(p.grad == 0) for p in net.parameters())
    weight = net.head.weight
    assert net.float().head.weight is weight and weight.dtype == "float32" and net.seen.dtype == "float32"
    with pytest.raises(NotImplementedError, match=r'Module \[Module\] is missing the required "forward"'):
        nn.Module()(1)


def test_registration_errors_name_the_module():
    net = Net()
    with pytest.raises(TypeError, match="Net.register_buffer: 'b' must be a Tensor, an array or None, got str"):
        net.register_buffer("b", "x")
    with pytest.raises(KeyError, match="without '.'"):
        net.register_buffer("a.b", Tensor(np.ones(1)))
    with pytest.raises(TypeError, match="Net.add_module: 'm' must be a Module or None, got int"):
        net.add_module("m", 1)
    with pytest.raises(TypeError, match="Sequential: int is not a Module"):
        nn.Sequential(nn.Linear(1, 1), 3)


def torch_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2, bias=False)).double()


def our_net():
    return nn.Sequential(nn.Linear(4, 5, dtype=np.float64), nn.Identity(), nn.Linear(5, 2, bias=False,
                                                                                      dtype=np.float64))


def test_state_dicts_cross_with_pytorch_both_ways():
    theirs, ours = torch_net(), our_net()
    state = {k: v.numpy() for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state)
    assert list(ours.state_dict()) == list(state) == ["0.weight", "0.bias", "2.weight"]
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(v, state[k])
    fresh = our_net()
    back = torch_net()
    back.load_state_dict({k: torch.tensor(v) for k, v in fresh.state_dict().items()})
    for k, v in back.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), fresh.state_dict()[k])


def test_load_state_dict_validates_everything_before_writing():
    ours = our_net()
    before = ours.state_dict()
    bad = dict(before)
    bad["2.weight"] = np.zeros((5, 2))  # transposed: PyTorch's (out, in) is expected
    bad["0.bias"] = np.full(5, 9.0)
    with pytest.raises(ShapeError, match=r"2.weight has shape \(5, 2\), expected \(2, 5\)"):
        ours.load_state_dict(bad)
    with pytest.raises(ValueError, match="0.bias must hold finite float64 numbers"):
        ours.load_state_dict({**before, "0.bias": np.full(5, np.nan)})
    with pytest.raises(KeyError, match=r"missing keys \['2.weight'\], unexpected keys \['x'\]"):
        ours.load_state_dict({"0.weight": before["0.weight"], "0.bias": before["0.bias"], "x": 1})
    for bad in ([("0.bias", np.zeros(5))], "0.bias", None):  # was a KeyError listing the items or letters
        with pytest.raises(TypeError, match=r"load_state_dict: expected a dict of names to arrays \(a state_dict"):
            ours.load_state_dict(bad)
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    result = ours.load_state_dict({"0.bias": np.zeros(5)}, strict=False)
    assert result.missing_keys == ["0.weight", "2.weight"] and result.unexpected_keys == []
    assert np.all(ours[0].bias.data == 0)


class Twice(nn.Module):
    """Doubles in training mode, passes through in eval mode: a step must re-trace on eval()."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1, dtype=np.float64)
        self.factor = 2.0

    def forward(self, x):
        y = self.lin(x)
        return y * self.factor if self.training else y


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_modes_settings_and_submodules_retrace(backend):
    model = Twice()
    forward = mlir_nn.jit(lambda x: model(x), backend=backend)
    x = np.random.randn(3, 2)
    expected = lambda: model.lin(x).data  # noqa: E731
    np.testing.assert_allclose(forward(x), 2 * expected(), rtol=1e-12)
    model.eval()
    np.testing.assert_allclose(forward(x), expected(), rtol=1e-12)
    model.train()
    model.factor = 3.0  # a plain setting baked into the trace
    np.testing.assert_allclose(forward(x), 3 * expected(), rtol=1e-12)
    model.lin = nn.Linear(2, 1, dtype=np.float64)
    np.testing.assert_allclose(forward(x), 3 * expected(), rtol=1e-12)


def test_deepcopy_and_dtype_changes():
    import copy

    net = Net()
    twin = copy.deepcopy(net)
    assert list(twin.state_dict()) == list(net.state_dict()) and twin.head.weight is not net.head.weight
    twin.body[0].weight.data[...] = 0
    assert np.any(net.body[0].weight.data != 0)
    forward = mlir_nn.jit(lambda x: net(x), backend="numpy")
    x = np.random.randn(3, 2)
    assert forward(x).dtype == np.float64
    net.float()  # other dtypes: re-traced
    assert forward(x.astype(np.float32)).dtype == np.float32
