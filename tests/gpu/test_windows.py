"""The window ops compiled for CUDA and run on the SIMT interpreter: race-free, in bounds,
equal to the NumPy reference."""

import pytest

from mlir_nn.gpu.simt_check import check_graph
from tests.codegen.test_windows import adaptive_and_pad_graph, conv_graph, nhwc_graph, pool_graph

GRAPHS = {
    "conv_strided_dilated": (lambda: conv_graph("float32", 2, (5, 4), 3, (3, 2), (2, 1), (1, 1, 0, 1), (1, 2), 1), 2),
    "conv_wide_input": (lambda: conv_graph("float32", 16, (5, 4), 3, (3, 2), (1, 2), (1, 0, 1, 1), (1, 1), 1), 2),
    "conv_grouped": (lambda: conv_graph("float64", 4, (5, 5), 4, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2), 1),
    "pooling": (lambda: pool_graph("float32", 2, (5, 6), (3, 2), (2, 1), (1, 1, 1, 1), (1, 1), True, True), 3),
    "pooling_tiles": (lambda: pool_graph("float32", 2, (6, 8), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), False, True), 2),
    "adaptive_and_pad": (lambda: adaptive_and_pad_graph("float32", 2, (5, 7), (3, 2)), 2),
    # the layout rules' NHWC forms: convolutions, pools and their gradients
    "nhwc": (lambda: nhwc_graph("float32", 3, (6, 8), 5, (3, 3), (2, 1), (1, 1, 1, 1), 1), 2),
    "nhwc_grouped": (lambda: nhwc_graph("float64", 4, (5, 6), 4, (3, 2), (1, 1), (1, 1, 0, 1), 2), 1),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_window_ops_are_simt_clean(name):
    build, batch = GRAPHS[name]
    result = check_graph(build(), batch)
    assert result.ok, result.problems


def test_max_pooling_gradients_go_to_the_first_of_tied_maxima_on_cuda():
    """Rounded inputs tie many window maxima: the CUDA kernels' index and gradient equal the
    reference's (the first maximum in row-major window order, as PyTorch)."""
    import numpy as np

    from mlir_nn.backends.cuda import compile_graph
    from mlir_nn.backends.reference import evaluate
    from mlir_nn.gpu.simt import SimtProgram
    from mlir_nn.gpu.simt_check import max_rel_err

    for graph, batch in (GRAPHS["pooling"], GRAPHS["pooling_tiles"]):
        graph = graph()
        rng = np.random.default_rng(0)
        inputs = [np.round(rng.standard_normal([batch if d == "N" else d for d in n.shape])).astype(n.dtype)
                  for n in graph.inputs]
        want, _ = evaluate(graph, inputs, [], batch)
        program = compile_graph(graph, (), cubin=False)
        got, report = SimtProgram(program.gpu_text, program.plan).run(inputs)
        assert report.clean, (report.races, report.out_of_bounds)
        for node, g, w in zip(graph.outputs, got, want):  # max pooling exactly, average pooling to rounding
            assert max_rel_err([g], [w]) <= (0.0 if node.op.startswith("max_pool") else 1e-6), node.op


def test_small_cnn_training_step_is_simt_clean():
    """A whole optimized step: Conv2d, BatchNorm2d, ReLU, MaxPool2d, Flatten, Linear, MSE, SGD."""
    import numpy as np

    from mlir_nn import nn
    from mlir_nn.egraph import optimize
    from mlir_nn.jit import trace_step
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    np.random.seed(0)
    f64 = {"dtype": np.float64}  # float64: the check's tolerance is then 1e-10
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1, **f64), nn.BatchNorm2d(3, **f64), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(3, 4, 2, **f64), nn.Flatten(), nn.Linear(4 * 2 * 2, 2, **f64))
    step = train_step(model, SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = np.zeros((2, 1, 6, 6)), np.zeros((2, 2))
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    result = check_graph(optimize(graph, batch_estimate=3)[0], 3)
    assert result.ok, result.problems


@pytest.mark.parametrize("name,batch,tiled", [
    ("lenet_step", 5, ("conv2d_bias", "conv2d_input_grad", "conv2d_weight_update")),
    ("vgg_step", 3, ("conv2d_bias", "conv2d_input_grad", "conv2d_weight_update")),
])
def test_cnn_steps_of_the_gpu_check_are_simt_clean(name, batch, tiled):
    """The float32 CNN steps the GPU check times: every convolution, its input and its weight
    gradient are register-tiled kernels only (implicit GEMMs: mlir_nn.gpu.gathers and scatters)."""
    import runpy
    from pathlib import Path

    import numpy as np

    from mlir_nn import nn
    from mlir_nn.backends.cuda import compile_graph
    from mlir_nn.egraph import optimize
    from mlir_nn.jit import trace_step
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    cases = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_cases.py"))
    case = cases["CASES"][name]
    np.random.seed(0)
    model = cases["cnn"](nn, case)
    step = train_step(model, SGD(model.parameters(), lr=case["lr"]))
    x = np.zeros((batch, *case["sizes"][:3]), np.float32)
    y = np.zeros((batch, case["sizes"][3]), np.float32)
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    graph = optimize(graph, batch_estimate=case["batches"][0])[0]
    program = compile_graph(graph, (), cubin=False)
    kernels = [r["kernel"] for r in program.plan["program"] if r["op"] == "gpu.launch_func"]
    for op in tiled:
        mine = [k for k in kernels if k.split("_", 2)[2].removesuffix("_tile64").removesuffix("_tile128") == op]
        assert mine and all(k.endswith(("_tile64", "_tile128")) for k in mine), (op, kernels)
    result = check_graph(graph, batch, program=program)
    assert result.ok, result.problems
