"""erf, numel and dropout compiled (cpu; cuda on the SIMT interpreter) against the NumPy reference:
dropout masks bit for bit, at awkward shapes, the largest keys and offsets, and a run-time batch."""

import numpy as np
import pytest

from mlir_nn.backends import get_backend
from mlir_nn.backends.reference import evaluate
from mlir_nn.engine import apply
from mlir_nn.gpu.simt import SimtProgram
from mlir_nn.ir import philox
from mlir_nn.jit import trace_step
from mlir_nn.nn.generator import draw_inputs

KEYS_AND_OFFSETS = [(0, 0), (67280421310721, 5), ((1 << 64) - 1, (1 << 48) - 3)]


def step(x, z):
    """Two dropout draws (slots 0 and 1, the second on 3-d input), erf and a run-time count."""
    chunks, slot = draw_inputs(x.dtype)
    first = apply("dropout", x, *chunks, p=0.3, slot=slot)
    chunks, slot = draw_inputs(x.dtype)
    second = apply("dropout", z, *chunks, p=0.75, slot=slot)
    return first, second, apply("erf", x) * apply("numel", z, axes=(0, 2))


def graph_and_arguments(dtype, batch, width, key, offset):
    graph, _, _ = trace_step(step, [np.zeros((2, width), dtype), np.zeros((2, 2, 3), dtype)], ["x", "z"])
    rng = np.random.default_rng(batch)
    inputs = [rng.standard_normal((batch, width)).astype(dtype), rng.standard_normal((batch, 2, 3)).astype(dtype)]
    chunks = {f"rng.key{i}": v for i, v in enumerate(philox.chunks(key, philox.KEY_CHUNKS))}
    chunks |= {f"rng.offset{i}": v for i, v in enumerate(philox.chunks(offset, philox.OFFSET_CHUNKS))}
    params = [np.array(chunks[p.attr("label")], dtype) for p in graph.params]
    return graph, inputs, params


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("key,offset", KEYS_AND_OFFSETS)
def test_cpu_equals_the_reference(dtype, key, offset):
    for batch, width in ((1, 1), (7, 13)):
        graph, inputs, params = graph_and_arguments(dtype, batch, width, key, offset)
        want, _ = evaluate(graph, inputs, params, batch)
        got = get_backend("cpu").compile(graph).run(inputs, params)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6 if dtype == "float32" else 1e-15)
        assert (want[0] != 0).any() or batch * width == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_kernels_equal_the_reference_on_the_simt_interpreter(dtype):
    from mlir_nn.backends.cuda import compile_graph

    key, offset = KEYS_AND_OFFSETS[2]
    graph, inputs, params = graph_and_arguments(dtype, 9, 5, key, offset)
    program = compile_graph(graph, (), cubin=False)
    got, report = SimtProgram(program.gpu_text, program.plan).run(inputs + params)
    want, _ = evaluate(graph, inputs, params, 9)
    assert report.clean
    np.testing.assert_array_equal(np.asarray(got[0]).reshape(want[0].shape), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]).reshape(want[1].shape), want[1])
    np.testing.assert_allclose(np.asarray(got[2]).reshape(want[2].shape), want[2], rtol=1e-6)
