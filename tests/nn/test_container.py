"""Sequential, ModuleList and ModuleDict: PyTorch's indexing, names and mutation, each change re-traced."""

import numpy as np
import pytest
import torch

import mlir_nn
from mlir_nn import nn
from tests.nn.torch_twin import assert_same_as_torch


def lin(i, o):
    return nn.Linear(i, o, dtype=np.float64)


def test_sequential_equals_pytorch_and_indexes_like_it():
    ours = nn.Sequential(lin(3, 4), nn.Identity(), lin(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2))
    assert_same_as_torch(ours, theirs, np.random.randn(6, 3))
    assert len(ours) == 3 and ours[-1] is ours[2] and isinstance(ours[1:], nn.Sequential) and len(ours[1:]) == 2
    with pytest.raises(IndexError, match="Sequential: index 3 is out of range for 3 modules"):
        ours[3]
    named = nn.Sequential({"fc": lin(2, 2), "out": lin(2, 1)})
    assert list(named.state_dict()) == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    named[1] = lin(2, 3)
    assert named.out.out_features == 3


def test_module_list_mutations_renumber():
    layers = nn.ModuleList([lin(1, 2), lin(2, 3)])
    layers.append(lin(3, 4))
    layers.insert(0, lin(5, 1))
    assert [m.in_features for m in layers] == [5, 1, 2, 3]
    del layers[1]
    popped = layers.pop(0)
    assert popped.in_features == 5 and [n for n, _ in layers.named_children()] == ["0", "1"]
    layers += [lin(4, 4)]
    assert list(layers.state_dict())[-1] == "2.bias" and len(layers) == 3
    with pytest.raises(NotImplementedError, match="ModuleList"):
        layers(np.ones(1))


def test_module_dict():
    heads = nn.ModuleDict({"a": lin(2, 1)})
    heads["b"] = lin(2, 3)
    assert list(heads) == ["a", "b"] and "b" in heads and len(heads) == 2
    assert list(heads.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    assert heads.pop("a").out_features == 1 and heads.keys() == ["b"]


@pytest.mark.parametrize("change", ["append", "setitem", "delitem", "dict"])
def test_container_changes_retrace(change):
    model = nn.Sequential(lin(2, 2), lin(2, 2))
    heads = nn.ModuleDict({"a": lin(2, 1)})
    forward = mlir_nn.jit(lambda x: heads["a"](model(x)) if change == "dict" else model(x), backend="numpy")
    x = np.random.randn(3, 2)
    forward(x)
    if change == "append":
        model.append(lin(2, 5))
    elif change == "setitem":
        model[1] = lin(2, 4)
    elif change == "delitem":
        del model[1]
    else:
        heads["a"] = lin(2, 6)
    expected = heads["a"](model(x)).data if change == "dict" else model(x).data
    np.testing.assert_allclose(forward(x), expected, rtol=1e-12)
