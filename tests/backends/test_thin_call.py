"""The cpu backend's thin call (mlir_nn/backends/thin_call.c): built once per cache, checks
plainly valid arguments in C and leaves everything else to the checked path."""

import gc
import signal
import weakref

import numpy as np
import pytest

from mlir_nn import jit
from mlir_nn.backends import get_backend, thin_call
from mlir_nn.backends.errors import NativeError
from mlir_nn.backends.reference import evaluate
from mlir_nn.ir import DTypeError, Graph, make_node
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step
from tests.backends.test_cpu import TOL


def _update_graph() -> Graph:
    """sum over the batch of x, and w -= s * g (g a static-shaped input like w)."""
    x = make_node("input", (), name="x", shape=("N", 3), dtype="float32")
    g = make_node("input", (), name="g", shape=(2, 3), dtype="float32")
    s = make_node("input", (), name="s", shape=(), dtype="float32")
    w = make_node("param", (), name="w", shape=(2, 3), dtype="float32")
    new_w = make_node("sub", (w, make_node("mul", (s, g))))
    return Graph((x, g, s), (w,), (make_node("sum_to", (x,), shape=(3,)), new_w), (("w", new_w),), name="thin")


def test_the_extension_is_built_into_the_cache_and_a_corrupt_one_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    thin_call.extension.cache_clear()
    try:
        module = thin_call.extension()
        built = list(tmp_path.glob("thin-call/*/_thin_call*.so"))
        assert len(built) == 1 and hasattr(module, "ThinCall")
        built[0].unlink()  # a new file (the loaded one stays mapped), its checksum now wrong
        built[0].write_bytes(b"\x7fELF but not a shared object")
        thin_call.extension.cache_clear()
        assert hasattr(thin_call.extension(), "ThinCall")
        assert b"PyInit__thin_call" in built[0].read_bytes()
    finally:
        thin_call.extension.cache_clear()


def test_no_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc
    thin_call.extension.cache_clear()
    try:
        with pytest.raises(NativeError, match="no C compiler"):
            thin_call.extension()
    finally:
        thin_call.extension.cache_clear()


def test_an_input_that_is_a_parameter_is_copied_not_read_while_written():
    graph = _update_graph()
    executable = get_backend("cpu").compile(graph)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((2, 3)).astype(np.float32)
    x, s = rng.standard_normal((7, 3)).astype(np.float32), np.array(0.5, np.float32)
    executable.run([x, np.ones((2, 3), np.float32), s], [weights])  # binds the parameter
    assert executable.run_plain([x, weights, s], [weights]) is None  # g is w itself: not plain
    want, _ = evaluate(graph, [x, weights.copy(), s], [weights.copy()], 7)
    got = executable.run([x, weights, s], [weights])
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, **TOL["float32"])
    np.testing.assert_allclose(weights, want[1], **TOL["float32"])


@pytest.mark.parametrize("batch", [1, 7, 13, 33, 257])
def test_plain_calls_match_the_reference_at_awkward_batch_sizes(batch):
    graph = _update_graph()
    executable = get_backend("cpu").compile(graph)
    rng = np.random.default_rng(batch)
    weights = rng.standard_normal((2, 3)).astype(np.float32)
    inputs = [rng.standard_normal((batch, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32),
              np.array(0.25, np.float32)]
    executable.run(inputs, [weights])  # checked: binds the parameter and this batch's workspace
    want, _ = evaluate(graph, inputs, [weights.copy()], batch)
    got = executable.run_plain(inputs, [weights])
    assert got is not None
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, **TOL["float32"])


def test_a_new_batch_size_or_another_parameter_array_takes_the_checked_path():
    graph = _update_graph()
    executable = get_backend("cpu").compile(graph)
    weights = np.ones((2, 3), np.float32)
    inputs = [np.ones((5, 3), np.float32), np.ones((2, 3), np.float32), np.array(1.0, np.float32)]
    executable.run(inputs, [weights])
    assert executable.run_plain([np.ones((6, 3), np.float32), *inputs[1:]], [weights]) is None
    assert executable.run_plain(inputs, [weights.copy()]) is None
    assert executable.run_plain(inputs, [weights]) is not None


def test_a_build_started_by_prepare_is_finished_by_extension(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    thin_call.extension.cache_clear()
    try:
        thin_call.prepare()
        assert thin_call.BUILD.building()  # cc runs in the background
        assert hasattr(thin_call.extension(), "ThinCall")
        assert not thin_call.BUILD.building() and len(list(tmp_path.glob("thin-call/*/_thin_call*.so"))) == 1
        thin_call.prepare()  # built and loaded: nothing to start
        assert not thin_call.BUILD.building()
    finally:
        thin_call.extension.cache_clear()


def test_a_cold_build_finds_its_target_and_hashes_the_source_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    targets, hashed = [], []
    build = thin_call.BUILD
    real_target, real_parts = build.target, build._key_parts
    monkeypatch.setattr(build, "target", lambda: targets.append(real_target()) or targets[-1])
    monkeypatch.setattr(build, "_key_parts", lambda: hashed.append(1) or real_parts())
    monkeypatch.setattr(build, "_key", None)
    thin_call.extension.cache_clear()
    try:
        thin_call.prepare()  # what a cold compile does first, then the executable loads the extension
        assert hasattr(thin_call.extension(), "ThinCall")
        assert len(targets) == 1 and len(hashed) == 1
    finally:
        thin_call.extension.cache_clear()


def _plain_arguments(batch: int = 5) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [np.ones((batch, 3), np.float32), np.ones((2, 3), np.float32), np.array(1.0, np.float32)], \
        [np.ones((2, 3), np.float32)]


def test_an_executable_nothing_refers_to_is_freed():
    """Its thin call refers back to it (the error callback): a cycle through a C object that
    only the garbage collector can free, and only when the type takes part in collection."""
    executable = get_backend("cpu").compile(_update_graph())
    inputs, params = _plain_arguments()
    executable.run(inputs, params)
    freed = weakref.ref(executable)
    del executable
    gc.collect()
    assert freed() is None


def test_a_parameter_whose_dtype_was_replaced_in_place_is_checked_again():
    """The snapshot kept its dtype's address only: a dtype freed by ``a.dtype = ...`` can leave
    another (here big-endian) one at that address, which then passed as the bound one."""
    executable = get_backend("cpu").compile(_update_graph())
    inputs, _ = _plain_arguments()
    weights = np.ones((2, 3), np.dtype(np.float32).newbyteorder("="))  # native, but its own dtype object
    executable.run(inputs, [weights])  # binds it
    bound = id(weights.dtype)
    for _ in range(100):  # without a reference held, the freed address comes back within a few tries
        weights.dtype = np.dtype(">f4")
        if id(weights.dtype) == bound:
            break
    assert executable.run_plain(inputs, [weights]) is None
    before = weights.copy()
    with pytest.raises(DTypeError, match="parameter w has dtype float32 in non-native byte order"):
        executable.run(inputs, [weights])
    np.testing.assert_array_equal(weights, before)


def test_bad_setup_of_the_thin_call_is_an_error_not_a_crash():
    executable = get_backend("cpu").compile(_update_graph())
    call = thin_call.extension().ThinCall
    with pytest.raises(ValueError, match="n_params must not be negative"):
        call(0, 0, 0, None, None, -1, print)
    buffer = np.zeros(64, np.uint8)
    for batch in (0, -1):  # -1 would match the batch that run() reports for arguments it cannot take
        with pytest.raises(ValueError, match="batch size must be positive"):
            executable._entry.bind_workspace(batch, buffer, (), ())
    f32 = np.dtype(np.float32)
    with pytest.raises(ValueError, match="one descriptor word per output"):
        executable._entry.bind_workspace(1, buffer, (((2,), f32),), ())
    with pytest.raises(ValueError, match="output sizes must be >= 0"):
        executable._entry.bind_workspace(1, buffer, (((2, -3), f32),), (0,))
    with pytest.raises(TypeError):
        executable._entry.bind_workspace(1, buffer, (((2,), "no such dtype"),), (0,))
    with pytest.raises(TypeError):
        executable._entry.bind_workspace(1, buffer, (([2], f32),), (0,))  # a shape is a tuple
    inputs, params = _plain_arguments()
    assert executable.run_plain(["not an array", *inputs[1:]], params) is None  # nothing bound now
    assert len(executable.run(inputs, params)) == 2


def test_every_call_hands_over_fresh_outputs_that_later_calls_leave_alone():
    """Outputs are written into arrays allocated for that call and returned as they are (no
    copy out of the workspace): a later call, plain or checked, at the same batch size or
    another, never writes into what an earlier one returned."""
    graph = _update_graph()
    executable = get_backend("cpu").compile(graph)
    rng = np.random.default_rng(5)
    g, s, w = np.zeros((2, 3), np.float32), np.array(0.0, np.float32), np.ones((2, 3), np.float32)
    kept = []
    for batch, plain in [(7, False), (7, True), (7, True), (4, False), (7, False), (7, True)]:
        x = rng.standard_normal((batch, 3)).astype(np.float32)
        if not plain:
            x = np.asfortranarray(x)  # not C-contiguous: the checked path
        got = executable.run_plain([x, g, s], [w]) if plain else None
        assert (got is not None) == plain
        got = got if plain else executable.run([x, g, s], [w])
        kept.append((got[0], got[0].copy(), x.sum(axis=0)))
    for value, snapshot, expected in kept:
        np.testing.assert_array_equal(value, snapshot)
        np.testing.assert_allclose(value, expected, **TOL["float32"])
    assert len({id(value) for value, _, _ in kept}) == len(kept)
    assert not any(np.shares_memory(a, b) for i, (a, _, _) in enumerate(kept) for b, _, _ in kept[i + 1:])


INTERRUPT_NEXT_READ = []  # a SIGINT is raised while the next learning-rate read runs


class SGDWithWatchedRate(SGD):
    """SGD whose learning rate a compiled step reads through a Python function of its own."""

    def update(self, p, grad, state, group):
        p -= self._hyper("lr", p.dtype, self._rate) * grad

    def _rate(self):
        if INTERRUPT_NEXT_READ:
            INTERRUPT_NEXT_READ.pop()
            signal.raise_signal(signal.SIGINT)  # a Ctrl-C landing while the feeds are refreshed
        return self.lr


def test_a_ctrl_c_in_a_hyperparameter_read_is_raised_not_swallowed():
    np.random.seed(0)
    model = MLP(2, [3, 1])
    step = jit(train_step(model, SGDWithWatchedRate(model.parameters(), lr=0.1)), backend="cpu", tiered=False)
    x, y = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
    step(x, y)  # compiled; the next calls take the thin call
    before = [p.data.copy() for p in model.parameters()]
    INTERRUPT_NEXT_READ.append(True)
    with pytest.raises(KeyboardInterrupt):
        step(x, y)
    for p, want in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.data, want)
    assert np.isfinite(step(x, y))
