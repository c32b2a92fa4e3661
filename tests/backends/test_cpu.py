"""The compiled CPU backend against the NumPy reference.

Tolerances: float32 rtol 2e-4 / atol 2e-5 (sums are accumulated in a different order
than NumPy's pairwise sums; libm's tanhf/expf differ by an ulp); float64 rtol 1e-9 /
atol 1e-11. Whole-step runs over 200 steps: float32 atol 2e-4 on the parameters.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlir_nn.backends import get_backend, kernel_build
from mlir_nn.backends.cpu import (
    THREAD_LOWERING,
    THREAD_PASS,
    CpuBackend,
    CpuExecutable,
    clear_memory_cache,
    compile_kernel,
    serial_pipeline,
)
from mlir_nn.backends.lowering import LoweringError
from mlir_nn.backends.native import OPT_LEVEL
from mlir_nn.backends.reference import evaluate
from mlir_nn.ir import DTypeError, Graph, ShapeError, make_node
from mlir_nn.support.disk_cache import cache_dir
from mlir_nn.support.pipelines import load_pipeline, parse_pipeline
from tests.codegen.zoo import arguments, elementwise_zoo, matmul_zoo

TOL = {"float32": dict(rtol=2e-4, atol=2e-5), "float64": dict(rtol=1e-9, atol=1e-11)}
_COMPILED: dict = {}


def compiled(graph: Graph):
    key = str(graph)
    if key not in _COMPILED:
        _COMPILED[key] = get_backend("cpu").compile(graph)
    return _COMPILED[key]


def check_against_reference(graph: Graph, batch: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    inputs, params = arguments(graph, batch, rng)
    want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
    got = compiled(graph).run(inputs, params)
    dtype = graph.inputs[0].dtype
    for node, g, w in zip(graph.outputs, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, node
        np.testing.assert_allclose(g, w, **TOL[dtype], err_msg=f"{node.op} {dict(node.attrs)}")


@settings(max_examples=12)
@given(width=st.sampled_from([1, 3, 8]), dtype=st.sampled_from(["float32", "float64"]),
       batch=st.sampled_from([1, 2, 7, 33]), seed=st.integers(0, 2**31))
def test_elementwise_broadcast_layout_and_reduction_ops(width, dtype, batch, seed):
    check_against_reference(elementwise_zoo(width, dtype), batch, seed)


@settings(max_examples=12)
@given(km=st.sampled_from([(1, 1), (3, 5), (7, 2)]), dtype=st.sampled_from(["float32", "float64"]),
       batch=st.sampled_from([1, 4, 9, 65]), seed=st.integers(0, 2**31))
def test_matmuls_and_fused_ops(km, dtype, batch, seed):
    check_against_reference(matmul_zoo(*km, dtype), batch, seed)


def test_one_compiled_step_serves_every_batch_size():
    graph = matmul_zoo(3, 5, "float32")
    first = compiled(graph)
    for batch in (1, 2, 100, 3):
        check_against_reference(graph, batch, batch)
    assert compiled(graph) is first


# ---------------------------------------------------------------------------- whole steps


def make_step(sizes, optimizer, backend, seed, **opt_args):
    from mlir_nn import jit
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD, Adam
    from mlir_nn.trainer import train_step

    np.random.seed(seed)
    model = MLP(sizes[0], sizes[1:])
    opt = (SGD if optimizer == "sgd" else Adam)(model.parameters(), **opt_args)

    train = train_step(model, opt)

    return jit(train, backend=backend), model, opt


@pytest.mark.parametrize("optimizer, sizes, opt_args", [
    ("sgd", [3, 8, 5, 1], dict(lr=0.02, momentum=0.9, weight_decay=0.01)),
    ("adam", [2, 7, 2], dict(lr=0.01, weight_decay=0.001)),
])
def test_200_training_steps_match_the_reference(optimizer, sizes, opt_args):
    fast, fast_model, fast_opt = make_step(sizes, optimizer, "cpu", 1, **opt_args)
    slow, slow_model, slow_opt = make_step(sizes, optimizer, "numpy", 1, **opt_args)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((96, sizes[0])).astype(np.float32)
    Y = np.sin(X.sum(axis=1, keepdims=True) * np.ones((1, sizes[-1]), np.float32))
    for step in range(200):
        lo = (step * 13) % 80
        batch = slice(lo, lo + 1 + step % 16)  # batch sizes 1..16, so many short batches
        a, b = fast(X[batch], Y[batch]), slow(X[batch], Y[batch])
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    for p, q in zip(fast_model.parameters(), slow_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4)
    state = fast.lower(X[:2], Y[:2]).captured
    reference_state = slow.lower(X[:2], Y[:2]).captured
    assert len(state) > len(sizes)  # optimizer buffers are part of the compiled state
    for p, q in zip(state, reference_state):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4, rtol=1e-3)


def test_adam_updates_moments_and_weights_from_the_old_state_in_one_step():
    x = make_node("input", [], name="x", shape=("N", 2), dtype="float64")
    w = make_node("param", [], name="w", shape=(2, 2), dtype="float64")
    m = make_node("param", [], name="m", shape=(2, 2), dtype="float64")
    v = make_node("param", [], name="v", shape=(2, 2), dtype="float64")
    c = lambda value: make_node("const", [], value=value, dtype="float64")  # noqa: E731
    h = make_node("matmul", [x, make_node("transpose", [w], perm=(1, 0))])  # reads the old w, transposed
    g = make_node("matmul", [h, x], transpose_a=True)
    new_m = make_node("add", [make_node("mul", [c(0.9), m]), make_node("mul", [c(0.1), g])])
    new_v = make_node("add", [make_node("mul", [c(0.999), v]), make_node("mul", [c(0.001), make_node("mul", [g, g])])])
    step = make_node("div", [new_m, make_node("add", [make_node("sqrt", [new_v]), c(1e-8)])])
    new_w = make_node("sub", [w, make_node("mul", [c(0.1), step])])
    graph = Graph((x,), (w, m, v), (make_node("sum", [w], axes=(0, 1), keepdims=False),),
                  (("w", new_w), ("m", new_m), ("v", new_v)), name="adam_like")
    rng = np.random.default_rng(0)
    params = [rng.standard_normal((2, 2)) for _ in range(3)]
    params[2] = np.abs(params[2])
    xs = rng.standard_normal((5, 2))
    (old_sum,), want = evaluate(graph, [xs], [p.copy() for p in params], 5)
    buffers = [p.ctypes.data for p in params]
    (got_sum,) = compiled(graph).run([xs], params)
    np.testing.assert_allclose(got_sum, old_sum)  # the output reads the weights before the update
    for p, q in zip(params, want):
        np.testing.assert_allclose(p, q, rtol=1e-12)
    assert [p.ctypes.data for p in params] == buffers  # updated in the user's own buffers


def test_parameter_returned_as_output_is_the_old_value():
    w = make_node("param", [], name="w", shape=(3,), dtype="float32")
    x = make_node("input", [], name="x", shape=("N", 3), dtype="float32")
    new_w = make_node("add", [w, make_node("sum_to", [x], shape=(3,))])
    graph = Graph((x,), (w,), (w, new_w), (("w", new_w),), name="echo")
    params = [np.arange(3, dtype=np.float32)]
    old, new = compiled(graph).run([np.ones((2, 3), np.float32)], params)
    np.testing.assert_array_equal(old, [0, 1, 2])
    np.testing.assert_array_equal(new, [2, 3, 4])
    np.testing.assert_array_equal(params[0], [2, 3, 4])


def test_the_default_backend_and_the_trainer_use_cpu():
    from mlir_nn.jit import DEFAULT_BACKEND
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import Trainer

    assert DEFAULT_BACKEND == "cpu"
    model = MLP(2, [4, 1])
    assert Trainer(model, SGD(model.parameters())).backend == "cpu"


# ---------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def linear_step():
    return compiled(matmul_zoo(3, 5, "float32"))


@pytest.mark.parametrize("mutate, error, message", [
    (lambda i, p: i.__setitem__(0, i[0][:, :2]), ShapeError, "input x has shape"),
    (lambda i, p: i.__setitem__(1, i[1][:2]), ShapeError, "batch size 2 but an earlier input has"),
    (lambda i, p: i.__setitem__(0, i[0].astype(np.float64)), DTypeError, "dtype float64, expected float32"),
    (lambda i, p: i.__setitem__(0, i[0].astype(">f4")), DTypeError, "input x has dtype float32 in non-native byte"),
    (lambda i, p: i[2].__setitem__((0, 0), np.nan), ValueError, "NaN or infinite"),
    (lambda i, p: i[0].__setitem__((1, 1), np.inf), ValueError, "NaN or infinite"),
    (lambda i, p: p.__setitem__(0, p[0][:2]), ShapeError, "parameter w has shape"),
    (lambda i, p: p.__setitem__(1, p[1].astype(np.float64)), DTypeError, "parameter bias"),
    (lambda i, p: p.__setitem__(1, p[1].astype(">f4")), DTypeError, "parameter bias has dtype float32 in non-native"),
    (lambda i, p: i.pop(), TypeError, "expected 3 inputs"),
    (lambda i, p: p[2].setflags(write=False), ValueError, "read-only"),
    (lambda i, p: p.__setitem__(0, np.asfortranarray(p[0])), ValueError, "not C-contiguous"),
    (lambda i, p: p.__setitem__(2, p[0]), ValueError, "share memory"),
])
def test_bad_input_raises_before_native_code_and_keeps_parameters(linear_step, mutate, error, message):
    rng = np.random.default_rng(0)
    inputs, params = arguments(linear_step.graph, 4, rng)
    linear_step.run(inputs, params)  # bind these arrays first: the fast path must notice the change
    before = [p.copy() for p in params]
    mutate(inputs, params)
    with pytest.raises(error, match=message):
        linear_step.run(inputs, params)
    for p, q in zip(params[:2] + params[3:], before[:2] + before[3:]):
        if p.shape == q.shape and p.dtype == q.dtype:
            np.testing.assert_array_equal(p, q)
    fresh_inputs, fresh_params = arguments(linear_step.graph, 4, rng)
    linear_step.run(fresh_inputs, fresh_params)  # still usable afterwards


def test_input_that_views_a_parameter_reads_the_old_value():
    graph = matmul_zoo(3, 3, "float64")
    rng = np.random.default_rng(1)
    inputs, params = arguments(graph, 3, rng)
    inputs[0] = params[2][:, :]  # x is a view of the parameter c (3x3)
    want, _ = evaluate(graph, [a.copy() for a in inputs], [p.copy() for p in params], 3)
    got = compiled(graph).run(inputs, params)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9)


def _misaligned(array: np.ndarray) -> np.ndarray:
    """A writable copy of ``array`` one byte past an aligned address."""
    out = np.frombuffer(bytearray(array.nbytes + 1), array.dtype, count=array.size, offset=1).reshape(array.shape)
    out[...] = array
    return out


@pytest.mark.parametrize("batch", [1, 13])
def test_misaligned_inputs_and_parameters_match_the_reference(batch):
    graph = matmul_zoo(3, 5, "float32")
    inputs, params = arguments(graph, batch, np.random.default_rng(batch))
    want_params = [p.copy() for p in params]
    want = get_backend("numpy").compile(graph).run([a.copy() for a in inputs], want_params)
    inputs, params = [_misaligned(a) for a in inputs], [_misaligned(p) for p in params]
    assert not any(a.flags.aligned for a in inputs + params if a.dtype.itemsize > 1)
    for got, expected in zip(compiled(graph).run(inputs, params) + params, want + want_params):
        np.testing.assert_allclose(got, expected, **TOL["float32"])


# ---------------------------------------------------------------------------- pipelines, errors, cache


def test_a_failing_pass_is_named():
    graph = matmul_zoo(1, 1, "float32")
    bad = parse_pipeline("canonicalize\nconvert-func-to-llvm{index-bitwidth=-3}\n", "bad")
    with pytest.raises(LoweringError, match="convert-func-to-llvm"):
        CpuBackend(bad).compile(graph)


def test_a_pipeline_that_stops_short_of_llvm_is_an_error_not_a_crash():
    with pytest.raises(LoweringError, match="did not lower everything to the LLVM dialect; left: .*arith.constant"):
        CpuBackend(parse_pipeline("canonicalize\n", "short")).compile(matmul_zoo(1, 1, "float32"))


def test_user_pipeline_file(tmp_path):
    text = load_pipeline("cpu").text.replace("linalg-fuse-elementwise-ops\n", "")
    path = tmp_path / "mine.pipeline"
    path.write_text("# no elementwise fusion\n" + text)
    assert "linalg-fuse-elementwise-ops" not in load_pipeline(str(path)).passes
    graph = matmul_zoo(2, 3, "float64")
    rng = np.random.default_rng(3)
    inputs, params = arguments(graph, 5, rng)
    want, _ = evaluate(graph, inputs, [p.copy() for p in params], 5)
    for g, w in zip(CpuBackend(str(path)).compile(graph).run(inputs, params), want):
        np.testing.assert_allclose(g, w, rtol=1e-9)


def test_the_serial_pipeline_is_the_cpu_pipeline_without_its_threads():
    """The quick tier's pipeline: cpu.pipeline in its order, less the kernel split's first pass and
    its thread pass and that one's lowering (the step stays one module, its parallel loops serial)."""
    full, serial = load_pipeline("cpu"), serial_pipeline(load_pipeline("cpu"))
    dropped = [p for p in full.passes if p not in serial.passes]
    assert [p for p in full.passes if p in serial.passes] == list(serial.passes)
    assert dropped and dropped[0] == "scf-forall-to-parallel"
    assert dropped == ["scf-forall-to-parallel", THREAD_PASS, THREAD_LOWERING]
    split = serial_pipeline(load_pipeline("cpu"), split=True)  # the quick tier's for deep steps
    assert list(split.passes) == [p for p in full.passes if p == "scf-forall-to-parallel" or p in serial.passes]


@pytest.mark.parametrize("serial", [False, True], ids=["cpu", "cpu-serial"])
@pytest.mark.parametrize("make", [lambda: matmul_zoo(37, 70, "float32"), lambda: elementwise_zoo(3, "float64"),
                                  lambda: elementwise_zoo(5, "float32")],
                         ids=["products", "elementwise", "elementwise-f32"])
def test_llvm_at_O0_computes_what_the_reference_does(make, serial):
    """The quick tier's code (``opt_level=0`` and its pipeline, mlir_nn.jit.tiered) at awkward
    batch sizes; it is a kernel of its own, never the one at the default level. Its pipeline
    has no threads: the step is one module, compiled in this process from the lowered module,
    and its code calls no task runtime."""
    graph = make()
    pipeline = serial_pipeline(load_pipeline("cpu")) if serial else load_pipeline("cpu")
    kernel = compile_kernel(graph, pipeline, use_disk=False, opt_level=0, workers=False)
    assert kernel.opt_level == 0 and kernel.source == "compiled"
    if serial:
        assert not kernel.threaded and "__kmpc" not in kernel.stages["llvm"]
        assert "llvm.func" in kernel.stages["llvm"] and "linalg" in kernel.stages
    if graph.inputs[0].dtype == "float32" and "exp" in {n.op for n in graph.nodes}:  # libm's, not expanded
        assert "llvm.intr.exp" in kernel.stages["llvm"]
    executable = CpuExecutable(graph, kernel)
    rng = np.random.default_rng(7)
    tolerance = TOL[graph.inputs[0].dtype]
    for batch in (1, 7, 13, 33, 257):
        inputs, params = arguments(graph, batch, rng)
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for got, expected in zip(executable.run(inputs, params), want):
            np.testing.assert_allclose(got, expected, **tolerance)
    assert compile_kernel(graph, use_disk=False).opt_level == OPT_LEVEL


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_a_compile_without_llvm_text_runs_the_same_code_and_a_later_request_for_the_text_gets_it(split):
    """``llvm_text=False`` (the quick tier) leaves the "llvm" and "linalg" stages out of a compile in this
    process, whole or split into kernels (one module); the memory cache answers a later request
    for the text with a compile that has it."""
    clear_memory_cache()
    graph = matmul_zoo(41, 300, "float32")
    pipeline = serial_pipeline(load_pipeline("cpu"), split=split)
    bare = compile_kernel(graph, pipeline, use_disk=False, opt_level=0, workers=False, llvm_text=False)
    assert "llvm" not in bare.stages and "linalg" not in bare.stages and not bare.threaded
    texted = compile_kernel(graph, pipeline, use_disk=False, opt_level=0, workers=False)
    assert texted.source == "compiled" and "llvm.func" in texted.stages["llvm"]
    assert "linalg.matmul" in texted.stages["linalg"]
    assert ("no_inline" in texted.stages["llvm"]) == split  # (kernels are functions of their own)
    again = compile_kernel(graph, pipeline, use_disk=False, opt_level=0, workers=False, llvm_text=False)
    assert again.source == "memory"
    rng = np.random.default_rng(3)
    for batch in (1, 13, 257):
        inputs, params = arguments(graph, batch, rng)
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for got, expected in zip(CpuExecutable(graph, bare).run(inputs, params), want):
            np.testing.assert_allclose(got, expected, **TOL["float32"])


def test_code_for_llvm_at_O0_calls_the_c_gemm_for_its_products():
    """At ``opt_level=0`` (the quick tier) the float products call the C GEMM (``codegen.gemm_calls``):
    no FMA of theirs for LLVM to compile, which the code at -O1 has."""
    graph, pipeline = matmul_zoo(257, 33, "float32"), serial_pipeline(load_pipeline("cpu"))
    texts = [compile_kernel(graph, pipeline, use_disk=False, opt_level=level, workers=False).stages["llvm"]
             for level in (0, 1)]
    assert "llvm.call @mlirnn_gemm_f32" in texts[0] and "mlirnn_gemm" not in texts[1]
    assert texts[0].count("llvm.intr.fmuladd") == 0 < texts[1].count("llvm.intr.fmuladd")


def _tiny_graph(scale: float) -> Graph:
    x = make_node("input", [], name="x", shape=("N", 2), dtype="float32")
    w = make_node("param", [], name="w", shape=(2,), dtype="float32")
    y = make_node("mul", [make_node("add", [x, w]), make_node("const", [], value=scale, dtype="float32")])
    return Graph((x,), (w,), (y,), (("w", make_node("sum_to", [y], shape=(2,))),), name="tiny")


def _check_tiny(kernel_graph: Graph, scale: float) -> None:
    exe = get_backend("cpu").compile(kernel_graph)
    w = np.array([1.0, 2.0], np.float32)
    (y,) = exe.run([np.ones((3, 2), np.float32)], [w])
    np.testing.assert_allclose(y, np.full((3, 2), [2.0, 3.0]) * scale, rtol=1e-6)
    np.testing.assert_allclose(w, [6 * scale, 9 * scale], rtol=1e-6)


def test_memory_and_disk_cache_and_corrupt_entries():
    graph = _tiny_graph(0.123)
    first = compile_kernel(graph)
    assert first.source in ("compiled", "disk")
    assert compile_kernel(graph).source == "memory"
    clear_memory_cache()
    assert compile_kernel(graph).source == "disk"
    _check_tiny(graph, 0.123)
    entries = [p for p in cache_dir().iterdir() if (p / "meta.json").exists()]
    entry = next(p for p in entries if json.loads((p / "meta.json").read_text())["symbol"] == "tiny"
                 and "1.230000e-01" in (p / "linalg.mlir").read_text())
    library = entry / "step.so"
    damaged = library.read_bytes()[:100] + b"garbage"
    library.unlink()  # a new file: the loaded library stays mapped, as after an atomic replace
    library.write_bytes(damaged)  # corrupt: checksum mismatch
    clear_memory_cache()
    assert compile_kernel(graph).source == "compiled"
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps(dict(meta, key="0" * 64)))  # stale metadata
    clear_memory_cache()
    assert compile_kernel(graph).source == "compiled"
    (entry / "meta.json").write_text("{not json")
    clear_memory_cache()
    assert compile_kernel(graph).source == "compiled"
    clear_memory_cache()
    assert compile_kernel(graph).source == "disk"
    _check_tiny(graph, 0.123)


def test_a_second_process_loads_the_step_from_disk():
    graph = _tiny_graph(0.5)
    compile_kernel(graph)
    program = (
        "from tests.backends.test_cpu import _tiny_graph, _check_tiny\n"
        "from mlir_nn.backends.cpu import compile_kernel\n"
        "g = _tiny_graph(0.5); print(compile_kernel(g).source); _check_tiny(g, 0.5)\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "disk"


# ---------------------------------------------------------------------------- blocked matmuls


@pytest.mark.parametrize("k, m, dtype", [
    (181, 197, "float32"),  # odd sizes: whole column panels plus a zero-padded one; register rows plus a rest
    (181, 197, "float64"),
    (2000, 20, "float64"),  # k over several kc slices; fewer columns than two panels
    (64, 1024, "float32"),  # whole panels only; B^T packed in 16x16 vector tiles
])
def test_large_matmuls_take_the_blocked_kernels_and_match_the_reference(k, m, dtype):
    from mlir_nn.codegen.cpu_matmul import PACKED

    graph = matmul_zoo(k, m, dtype)
    linalg_text = compiled(graph).stages["llvm"]
    assert "llvm.intr.fmuladd" in linalg_text or "llvm.intr.fma" in linalg_text  # vector FMAs were emitted
    assert PACKED not in linalg_text
    for batch in (1, 11, 12, 13, 25):
        check_against_reference(graph, batch, batch)


def test_which_matmuls_are_blocked():
    from mlir_nn.codegen import emit_linalg
    from mlir_nn.codegen.cpu_matmul import rewrite_matmuls

    assert rewrite_matmuls(emit_linalg(matmul_zoo(3, 5, "float32"))) == (0, 10)
    blocked, looped = rewrite_matmuls(emit_linalg(matmul_zoo(181, 197, "float32")))
    assert blocked > 0 and looped > 0  # w^T @ x^T has the batch as its column count: looped


# ---------------------------------------------------------------------------- the call fast path


@pytest.fixture
def mlp_step():
    """A jitted MLP training step whose arguments all take the fast path (batch-major)."""
    from mlir_nn import jit
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    model = MLP(3, [5, 5, 2])
    opt = SGD(model.parameters(), lr=0.1)

    step = train_step(model, opt)

    fn = jit(step, backend="cpu")
    x, y = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    fn(x, y)
    return fn, model, x, y


@pytest.mark.parametrize("mutate, error, message", [
    (lambda m: m.parameters()[0].data.setflags(write=False), ValueError, "read-only"),
    (lambda m: setattr(m.parameters()[0], "_data", np.asfortranarray(m.parameters()[0].data)), ValueError,
     "not C-contiguous"),
    (lambda m: setattr(m.parameters()[1], "_data", m.parameters()[3].data), ValueError, "share memory"),
    (lambda m: setattr(m.parameters()[2], "_data", np.ones((4, 2), np.float32)), ShapeError, "parameter p2"),
])
def test_fast_path_notices_changed_parameters(mlp_step, mutate, error, message):
    fn, model, x, y = mlp_step
    buffers = [p.data for p in model.parameters()] + [p.data for p in model.parameters()]
    mutate(model)
    buffers[len(buffers) // 2:] = [p.data for p in model.parameters()]
    before = [b.copy() for b in buffers]
    with pytest.raises(error, match=message):
        fn(x, y)
    for buffer, copy in zip(buffers, before):  # no buffer, old or new, was written
        np.testing.assert_array_equal(buffer, copy)


def test_fast_path_reads_read_only_inputs_and_fresh_arrays(mlp_step):
    fn, model, x, y = mlp_step
    x_ro = np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32)
    x_ro.setflags(write=False)
    y7 = np.ones((7, 2), np.float32)
    step = fn.lower(x_ro, y7)
    reference = [t.data.copy() for t in step.captured]  # weights, then the learning rate
    loss = fn(x_ro, y7)
    graph = step.optimized_graph
    (want,), _ = evaluate(graph, [x_ro, y7], reference, 7)
    np.testing.assert_allclose(loss, want, rtol=2e-4)
    assert fn(np.ones((2, 3, 1), np.float32).reshape(2, 3), np.ones((2, 2), np.float32)).shape == ()


def test_huge_batches_do_not_grow_the_stack():
    """Blocked products once kept per-iteration stack buffers: a batch of 40,000 crashed."""
    from mlir_nn import jit
    from mlir_nn.nn import MLP

    model = MLP(2, [32, 32, 16, 1])
    forward = jit(lambda x: model(x), backend="cpu")
    x = np.random.default_rng(0).standard_normal((200_000, 2)).astype(np.float32)
    allocas = [line for line in forward.lower(x[:10]).as_text("llvm").splitlines() if "llvm.alloca" in line]
    assert all(" x i32 " in line for line in allocas)  # only the scoped MXCSR slots (codegen.fp_env)
    out = forward(x)
    (want,), _ = evaluate(forward.lower(x).optimized_graph, [x], [p.data for p in model.parameters()], len(x))
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-4)


def test_fast_path_takes_static_shaped_inputs():
    """Inputs without a batch dim (a split step's gradients) take the fast path too; a wrong
    static shape or a view still goes to the checked path, and a NaN is refused by the
    compiled step's own input check with parameters untouched."""
    x = make_node("input", (), name="x", shape=("N", 3), dtype="float32")
    g = make_node("input", (), name="g", shape=(2, 3), dtype="float32")
    s = make_node("input", (), name="s", shape=(), dtype="float32")
    w = make_node("param", (), name="w", shape=(2, 3), dtype="float32")
    new_w = make_node("sub", (w, make_node("mul", (s, g))))
    graph = Graph((x, g, s), (w,), (make_node("sum_to", (x,), shape=(3,)), new_w), (("w", new_w),),
                  name="static_inputs")
    executable = get_backend("cpu").compile(graph)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32),
              np.array(0.5, np.float32)]
    weights = rng.standard_normal((2, 3)).astype(np.float32)
    executable.run(inputs, [weights])  # binds the parameter
    want, _ = evaluate(graph, inputs, [weights.copy()], 5)
    got = executable.run_plain(inputs, [weights])
    assert got is not None
    for g_, w_ in zip(got, want):
        np.testing.assert_allclose(g_, w_, **TOL["float32"])
    no_batch = get_backend("cpu").compile(Graph((g, s), (w,), (new_w,), (("w", new_w),), name="static_only"))
    no_batch.run(inputs[1:], [weights])
    assert no_batch.run_plain(inputs[1:], [weights]) is not None  # no batch dim anywhere
    bad_shape = [inputs[0], np.ones((3, 2), np.float32), inputs[2]]
    with_nan = [inputs[0], np.full((2, 3), np.nan, np.float32), inputs[2]]
    view = [inputs[0], np.ones((4, 3), np.float32)[:2], inputs[2]]
    for args in (bad_shape, view):
        assert executable.run_plain(args, [weights]) is None
    before = weights.copy()
    with pytest.raises(ValueError, match="input g contains 6 NaN or infinite"):
        executable.run_plain(with_nan, [weights])
    np.testing.assert_array_equal(weights, before)


def test_a_forced_convolution_form_is_part_of_the_cache_key(monkeypatch, tmp_path):
    """``$MLIR_NN_CONV_FORM`` changes a convolution's code, not the graph: a step compiled under one
    form is not reused under another (neither from memory nor from disk), and each is right."""
    from mlir_nn.ir import conv_forms
    from tests.codegen.test_windows import check, conv_graph

    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    graph = conv_graph("float32", 3, (7, 5), 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    texts = {}
    for form in ("gemm", "taps", "gemm"):
        monkeypatch.setenv(conv_forms.FORM_ENV, form)
        kernel = compile_kernel(graph)
        assert kernel.source == ("compiled" if form not in texts else "memory"), (form, kernel.source)
        texts.setdefault(form, kernel.stages["linalg"])
        check(graph, 7)
    assert texts["gemm"] != texts["taps"]
    clear_memory_cache()
    monkeypatch.setenv(conv_forms.FORM_ENV, "taps")
    assert compile_kernel(graph).source == "disk"


def test_the_computing_threads_are_part_of_the_cache_key(monkeypatch, tmp_path):
    """Passes over a static leading dim are cut into one block a computing thread at most
    (``parallel_maps``): a step compiled for 2 threads is not reused for 4 (from memory or disk)."""
    from mlir_nn.backends.thread_pool import ENV
    from tests.codegen.test_windows import conv_graph

    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(tmp_path))
    graph = conv_graph("float32", 3, (7, 5), 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    for threads, source in (("2", "compiled"), ("4", "compiled"), ("2", "memory")):
        monkeypatch.setenv(ENV, threads)
        assert compile_kernel(graph).source == source, threads
    clear_memory_cache()
    monkeypatch.setenv(ENV, "4")
    assert compile_kernel(graph).source == "disk"


def test_a_split_step_at_o0_selects_fast_for_its_c_interface_only_and_computes_the_same(monkeypatch):
    """At -O0 a step split into kernels and compiled as one module (the quick tier's deep steps)
    has its C interface, where the step is inlined, marked ``optnone`` (``kernel_build.select_fast``),
    and no kernel; it computes bit for bit what the unmarked code does at awkward batch sizes, and the
    reference (to 257 rows: at 4099 both differ from it by up to 2.5x the float32 tolerance, the
    quick tier's sums over the batch being plain float32 loops). At -O1 nothing is marked."""
    graph = matmul_zoo(13, 70, "float32")
    split = serial_pipeline(load_pipeline("cpu"), split=True)
    kernel = compile_kernel(graph, split, use_disk=False, opt_level=0, workers=False, llvm_text=True)
    marked = [line for line in kernel.stages["llvm"].splitlines()
              if line.startswith("  llvm.func") and "optimize_none" in line]
    assert len(marked) == 1 and "@_mlir_ciface_" in marked[0] and "no_inline" in marked[0]
    assert kernel.stages["llvm"].count("  llvm.func @k") > 1  # (split: kernels, none of them marked)
    monkeypatch.setattr(kernel_build, "select_fast", lambda module, interface: None)
    clear_memory_cache()
    unmarked = compile_kernel(graph, split, use_disk=False, opt_level=0, workers=False, llvm_text=True)
    assert "optimize_none" not in unmarked.stages["llvm"]
    executables = CpuExecutable(graph, kernel), CpuExecutable(graph, unmarked)
    rng = np.random.default_rng(12)
    for batch in (1, 7, 13, 33, 257, 4099):
        inputs, params = arguments(graph, batch, rng)
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        got, plain = (executable.run(inputs, [p.copy() for p in params]) for executable in executables)
        for fast, slow, expected in zip(got, plain, want):
            np.testing.assert_array_equal(fast, slow)
            if batch <= 257:
                np.testing.assert_allclose(fast, expected, **TOL["float32"])
    monkeypatch.undo()
    clear_memory_cache()
    optimized = compile_kernel(graph, split, use_disk=False, opt_level=1, workers=False, llvm_text=True)
    assert "optimize_none" not in optimized.stages["llvm"]


def test_a_step_compiled_without_the_disk_cache_stays_in_memory_and_computes_the_reference():
    """The quick tier's compile (one module, no disk cache, no workers) keeps its code in the JIT
    (``kernel_build.compile_resident``): nothing linked, at awkward batch sizes as the reference."""
    graph = matmul_zoo(13, 70, "float32")
    kernel = compile_kernel(graph, serial_pipeline(load_pipeline("cpu")), use_disk=False, opt_level=0,
                            workers=False, llvm_text=False)
    assert type(kernel.native.owner).__name__ == "ExecutionEngine" and "link" not in kernel.timings
    executable = CpuExecutable(graph, kernel)
    rng = np.random.default_rng(11)
    for batch in (1, 7, 13, 33, 257, 4099):
        inputs, params = arguments(graph, batch, rng)
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for got, expected in zip(executable.run(inputs, params), want):
            np.testing.assert_allclose(got, expected, **TOL["float32"])
