"""Checkpoints: state dicts of modules and optimizers, save/load to one npz file without pickle."""

import io
import json
import os
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlir_nn
from mlir_nn.checkpoint import CheckpointError
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
    with pytest.raises(CheckpointError, match="holds object; a checkpoint holds numeric arrays only"):
        mlir_nn.load(tmp_path / "obj.npz")


def _state(fill, size=1000):
    return {"model": {"w": np.full(size, fill, np.float32)}, "step": int(fill)}


SAVER = """
import resource, signal, sys
import numpy as np
import mlir_nn
limit, path, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
i = 1
while True:
    mlir_nn.save({"model": {"w": np.full(size, i, np.float32)}, "step": i}, path)
    print(i, flush=True)
    i += 1
    if limit:
        break
"""


def test_a_save_that_runs_out_of_space_leaves_the_old_checkpoint(tmp_path):
    path = tmp_path / "ckpt.npz"
    mlir_nn.save(_state(7), path)
    done = subprocess.run([sys.executable, "-c", SAVER, "100000", str(path), str(1 << 20)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "File too large" in done.stderr
    got = mlir_nn.load(path)
    assert got["step"] == 7 and np.all(got["model"]["w"] == 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.npz"]  # the temporary file is removed


def test_a_killed_save_leaves_the_old_checkpoint_and_readers_see_whole_files(tmp_path):
    path = tmp_path / "ckpt.npz"
    mlir_nn.save(_state(0, 1 << 21), path)
    saver = subprocess.Popen([sys.executable, "-c", SAVER, "0", str(path), str(1 << 21)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert saver.stdout.readline()  # one save finished: the next ones are under way
        steps = []
        for _ in range(30):  # a reader polling while the saves replace the file
            got = mlir_nn.load(path)
            assert np.all(got["model"]["w"] == got["step"])
            steps.append(got["step"])
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait()
    got = mlir_nn.load(path)
    assert np.all(got["model"]["w"] == got["step"]) and got["step"] >= max(steps) >= 1


def _archive(path, entries, compression=zipfile.ZIP_STORED):
    """A zip of raw ``entries`` {name: bytes} (a hostile file's parts)."""
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def _npy(array):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def _structure(root, fmt="mlir-nn-checkpoint/1"):
    return _npy(np.frombuffer(json.dumps({"format": fmt, "root": root}).encode(), np.uint8))


def _header(shape):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return header.getvalue()


def _huge_header():
    return _header((10 ** 12,)) + b"\0" * 64


@pytest.mark.parametrize("entries,match", [
    ({"__structure__.npy": _structure({"array": "nope"})}, "names an array 'nope' that the archive does not hold"),
    ({"__structure__.npy": _structure([1, 2])}, r"root is \[1, 2\]; expected one of"),
    ({"__structure__.npy": _structure({"items": [[1.5, {"value": 1}]]})}, r"root has an item \[1.5, "),
    ({"__structure__.npy": _structure({"value": {"x": 1}})}, r"root is \{'value': \{'x': 1\}\}"),
    ({"__structure__.npy": _structure({"list": [{"list": []}]}, fmt="other/2")}, "has format 'other/2'"),
    ({"__structure__.npy": _npy(np.frombuffer(b"[" * 100000, np.uint8))}, "nested deeper than"),
    ({"__structure__.npy": _npy(np.frombuffer(json.dumps({"format": "mlir-nn-checkpoint/1", "root": {"list": []}})
                                              .encode().replace(b"[]", b"[" + b'{"list": [' * 150 + b"]}" * 150
                                                                + b"]"), np.uint8))}, "nested deeper than 100"),
    ({"__structure__.npy": _npy(np.frombuffer(b"\xff\xfe", np.uint8))}, "not valid JSON text"),
    ({"__structure__.npy": _npy(np.ones(3))}, "expected uint8 text"),
    ({"__structure__.npy": _structure({"array": "a0"}), "a0.npy": _huge_header()}, r"claims shape \(1000000000000,\)"),
    ({"__structure__.npy": _structure({"array": "a0"}), "a0.npy": _npy(np.ones(4))[:-8]}, "holds 24 bytes"),
    ({"__structure__.npy": _structure({"array": "a0"}), "a0.npy": b"not an npy"}, "entry a0.npy is corrupt"),
    ({"__structure__.npy": _structure({"array": "a0"}), "a0.npy": _header((-2, -3)) + b"\0" * 48},
     r"claims shape \(-2, -3\); a dimension cannot be negative"),
    ({"__structure__.npy": _structure({"array": "a0"}), "a0.npy": _header((-1, 0))},
     r"claims shape \(-1, 0\); a dimension cannot be negative"),
])
def test_load_names_the_file_and_the_problem(entries, match, tmp_path):
    path = _archive(tmp_path / "bad.npz", entries)
    with pytest.raises(CheckpointError, match=match) as error:
        mlir_nn.load(path)
    assert str(error.value).startswith(f"load: {path}")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_load_refuses_what_is_not_a_regular_file_without_reading_it(special, tmp_path):
    """Loading /dev/zero read forever, and a pipe waited for a writer forever."""
    if special == "fifo":
        os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    path = special if special.startswith("/") else str(tmp_path / special)
    with pytest.raises(CheckpointError, match=f"load: {path} is not a regular file"):
        mlir_nn.load(path)


def test_load_refuses_damaged_and_missing_files(tmp_path):
    mlir_nn.save(_state(3), tmp_path / "good.npz")
    whole = (tmp_path / "good.npz").read_bytes()
    for name, data in {"empty.npz": b"", "half.npz": whole[:len(whole) // 2], "text.npz": b"hello"}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match=f"load: .*{name} is not an mlir-nn checkpoint"):
            mlir_nn.load(tmp_path / name)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        mlir_nn.load(tmp_path / "missing.npz")


def test_load_reads_only_the_entries_the_structure_names(tmp_path):
    """A compressed entry that would inflate to 1 GB and a corrupt one, neither named: never read."""
    path = tmp_path / "extra.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__structure__.npy", _structure({"items": [["w", {"array": "a0"}]]}))
        z.writestr("a0.npy", _npy(np.arange(3.0)))
        z.writestr("bomb.npy", _huge_header() + bytes(1 << 20), compress_type=zipfile.ZIP_DEFLATED)
    got = mlir_nn.load(path)
    assert list(got) == ["w"] and got["w"].tolist() == [0.0, 1.0, 2.0]
    _archive(path, {"__structure__.npy": _structure({"array": "a0"}), "a0.npy": _npy(np.ones(2))},
             compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(CheckpointError, match="entry __structure__.npy is compressed"):
        mlir_nn.load(path)


def test_save_refuses_cycles_and_keeps_the_old_file(tmp_path):
    mlir_nn.save(_state(1), tmp_path / "c.npz")
    cycle = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="nested deeper than 100 levels"):
        mlir_nn.save({"c": cycle}, tmp_path / "c.npz")
    assert mlir_nn.load(tmp_path / "c.npz")["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]


@settings(max_examples=60, derandomize=True, deadline=None)
@given(data=st.data())
def test_a_corrupted_checkpoint_loads_whole_or_raises_a_checkpoint_error(data, tmp_path_factory):
    """Random damage (bytes changed, cut short, inserted): the original back, or CheckpointError."""
    path = tmp_path_factory.mktemp("fuzz") / "f.npz"
    original = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "n": [1, "x", None]}
    mlir_nn.save(original, path)
    raw = bytearray(path.read_bytes())
    kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    if kind == "flip":
        raw[at] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        del raw[at:]
    else:
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    path.write_bytes(bytes(raw))
    try:
        got = mlir_nn.load(path)
    except CheckpointError:
        return
    assert got["n"] == original["n"]
    np.testing.assert_array_equal(got["model"]["w"], original["model"]["w"])
