"""Checkpoints: state dicts of modules and optimizers, save/load to one npz file without pickle."""

import zipfile

import numpy as np
import pytest

import mlir_nn
from mlir_nn.losses import cross_entropy
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import train_step


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((40, 5)).astype(np.float32), rng.integers(0, 3, 40).astype(np.float32)


def _fresh(opt_name, seed):
    np.random.seed(seed)
    model = MLP(5, [16, 3])
    opt = Adam(model.parameters(), lr=0.01, weight_decay=1e-3) if opt_name == "adam" \
        else SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    return model, opt


def _train(model, opt, steps, start, backend):
    step = mlir_nn.jit(train_step(model, opt, cross_entropy), backend=backend)
    X, y = _data()
    for i in range(start, start + steps):
        rows = slice((i * 7) % 33, (i * 7) % 33 + 7)
        step(X[rows], y[rows])


@pytest.mark.parametrize("opt_name", ["adam", "sgd"])
@pytest.mark.parametrize("backend", ["cpu", "numpy"])
def test_ten_steps_save_load_ten_more_equals_twenty(opt_name, backend, tmp_path):
    straight, opt = _fresh(opt_name, 0)
    _train(straight, opt, 20, 0, backend)

    first, opt = _fresh(opt_name, 0)
    _train(first, opt, 10, 0, backend)
    mlir_nn.save({"model": first.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.npz")

    resumed, opt2 = _fresh(opt_name, 1)  # other initial values, overwritten by the checkpoint
    checkpoint = mlir_nn.load(tmp_path / "ckpt.npz")
    resumed.load_state_dict(checkpoint["model"])
    opt2.load_state_dict(checkpoint["optimizer"])
    _train(resumed, opt2, 10, 10, backend)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_optimizer_state_dict_has_pytorchs_shape():
    model, opt = _fresh("adam", 0)
    _train(model, opt, 1, 0, "numpy")
    state = opt.state_dict()
    assert state["param_groups"] == [{"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-3,
                                      "params": [0, 1, 2, 3]}]
    assert sorted(state["state"]) == [0, 1, 2, 3]
    assert state["state"][0]["exp_avg"].shape == (5, 16) and state["state"][3]["exp_avg_sq"].shape == (3,)
    sgd = SGD(model.parameters(), lr=0.1)
    assert sgd.state_dict() == {"state": {}, "param_groups": [{"lr": 0.1, "momentum": 0.0, "dampening": 0.0,
                                                                "weight_decay": 0.0, "nesterov": False,
                                                                "params": [0, 1, 2, 3]}]}


def test_loading_state_into_a_compiled_step_updates_what_it_reads():
    """State tensors are written in place, so a step compiled before the load uses the loaded values."""
    model, opt = _fresh("sgd", 0)
    _train(model, opt, 3, 0, "cpu")
    buffers = [t for slot in opt.state.values() for t in slot.values()]
    opt.load_state_dict({"state": {i: {"momentum_buffer": np.zeros(p.shape)} for i, p in enumerate(model.parameters())},
                         "param_groups": [{"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3, "params": [0, 1, 2, 3]}]})
    assert [t for slot in opt.state.values() for t in slot.values()] == buffers
    assert all(np.all(t.data == 0) for t in buffers)


def test_file_is_data_only(tmp_path):
    mlir_nn.save({"w": np.arange(3.0), "n": 3, "nested": [1.5, "x", None, {4: np.eye(2, dtype=np.float32)}]},
                 tmp_path / "f.npz")
    with zipfile.ZipFile(tmp_path / "f.npz") as z:
        for name in z.namelist():
            assert not z.read(name).startswith(b"\x80")  # no pickle stream in any entry
    got = mlir_nn.load(tmp_path / "f.npz")
    assert got["n"] == 3 and got["nested"][:3] == [1.5, "x", None]
    np.testing.assert_array_equal(got["w"], np.arange(3.0))
    assert got["nested"][3][4].dtype == np.float32
    mlir_nn.save(MLP(2, [3]), tmp_path / "m.npz")  # anything with state_dict()
    assert list(mlir_nn.load(tmp_path / "m.npz")) == ["layers.0.W", "layers.0.b"]


@pytest.mark.parametrize("obj,match", [
    ({"f": print}, r"save: obj\['f'\] is a builtin_function_or_method; a checkpoint holds"),
    ({"a": np.array(["x"])}, r"save: obj\['a'\] is an array of <U1"),
    ({(1, 2): 1}, "has a key of type tuple"),
])
def test_save_refuses_code_and_odd_values(obj, match, tmp_path):
    with pytest.raises(TypeError, match=match):
        mlir_nn.save(obj, tmp_path / "x.npz")


def test_load_refuses_other_files(tmp_path):
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="is not an mlir-nn checkpoint"):
        mlir_nn.load(tmp_path / "plain.npz")
    np.savez(tmp_path / "obj.npz", __structure__=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        mlir_nn.load(tmp_path / "obj.npz")
