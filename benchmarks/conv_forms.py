"""Calibration of the convolution forms' cost (``mlir_nn.ir.conv_forms``): each form of each
convolution, forward, weight gradient and input gradient, compiled alone for the CPU and timed
on one thread (process CPU time, median of interleaved rounds), beside the cost model's
prediction for it and the form the model picks.

Run with ``MLIR_NN_NUM_THREADS=1``. A form is forced by ``$MLIR_NN_CONV_FORM`` while the one-op
graph compiles (the compiled-step cache keys on it), the form also in the graph's name.
Fit the rates in ``conv_forms`` so that the predicted ratios between forms follow the measured ones.
``--layout NHWC`` times the ops' NHWC forms (``mlir_nn.ir.layouts``), and a transpose of each image
between the layouts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

# (label, batch, in channels, image side, out channels, kernel, stride, padding, groups)
SHAPES = [
    ("lenet conv1", 64, 1, 28, 6, 5, 1, 2, 1),
    ("lenet conv2", 64, 6, 14, 16, 5, 1, 0, 1),
    ("vgg conv1", 128, 3, 32, 32, 3, 1, 1, 1),
    ("vgg conv2", 128, 32, 16, 64, 3, 1, 1, 1),
    ("vgg conv3", 128, 64, 8, 128, 3, 1, 1, 1),
    ("1x1", 32, 64, 14, 64, 1, 1, 0, 1),
    ("7x7 stride 2", 16, 3, 64, 16, 7, 2, 3, 1),
    ("depthwise", 32, 32, 16, 32, 3, 1, 1, 32),
    ("3x3 stride 2", 32, 32, 16, 64, 3, 2, 1, 1),
]
OPS = ("conv2d", "conv2d_weight_grad", "conv2d_input_grad")


def one_op_graph(name: str, op: str, n: int, c: int, hw: int, o: int, k: int, stride: int, pad: int, groups: int,
                 layout: str = "NCHW"):
    """A graph whose one output is ``op`` of the convolution, its operands inputs (images in ``layout``)."""
    from mlir_nn.ir import Graph, make_node
    from mlir_nn.ir.layouts import layout_shape
    from mlir_nn.ir.windows import axes_of

    attrs = dict(stride=(stride, stride), padding=(pad,) * 4, dilation=(1, 1), groups=groups)
    ys, xs = axes_of("conv2d", (hw, hw), (k, k), attrs)
    x_shape, w_shape, y_shape = (n, c, hw, hw), (o, c // groups, k, k), (n, o, ys.out, xs.out)
    x_shape, y_shape = layout_shape(x_shape, layout), layout_shape(y_shape, layout)
    if layout != "NCHW":
        attrs["layout"] = layout
    operands = {"conv2d": (x_shape, w_shape), "conv2d_weight_grad": (x_shape, y_shape),
                "conv2d_input_grad": (y_shape, w_shape)}[op]
    leaves = tuple(make_node("input", [], name=f"a{i}", shape=s, dtype="float32") for i, s in enumerate(operands))
    extra = {"conv2d": {}, "conv2d_weight_grad": dict(kernel=(k, k)),
             "conv2d_input_grad": dict(input_hw=(hw, hw))}[op]
    return Graph(leaves, (), (make_node(op, list(leaves), **attrs, **extra),), name=name)


def compiled(op: str, dims: list[int], form: str, layout: str = "NCHW") -> Callable[[], object]:
    """``op`` of a convolution of ``dims`` compiled for the CPU in ``form``."""
    from mlir_nn.backends.cpu import CpuBackend
    from mlir_nn.ir import conv_forms

    graph = one_op_graph(f"{op}_{form}_{layout}", op, *dims, layout=layout)
    os.environ[conv_forms.FORM_ENV] = form
    try:
        executable = CpuBackend().compile(graph)
    finally:
        del os.environ[conv_forms.FORM_ENV]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(i.shape).astype(np.float32) for i in graph.inputs]
    return lambda: executable.run(inputs, [])


def timed(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median over interleaved rounds of each function's median CPU time over at least 0.2 s."""
    for fn in fns.values():
        fn()
    medians: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            times: list[float] = []
            start = time.process_time()
            while len(times) < 3 or time.process_time() - start < 0.2:
                t = time.process_time()
                fn()
                times.append(time.process_time() - t)
            medians[label].append(statistics.median(times))
    return {k: statistics.median(v) for k, v in medians.items()}


def main() -> None:
    from mlir_nn.ir import conv_forms

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="only the shapes whose label contains this text")
    parser.add_argument("--layout", default="NCHW", choices=("NCHW", "NHWC", "both"),
                        help="the ops' image layout (both: each form in both, timed interleaved)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, threads {os.environ.get('MLIR_NN_NUM_THREADS', 'all')}")
    print(f"{'shape':14s} {'op':20s} {'form':7s} {'measured us':>11s} {'model us':>9s}  picked")
    layouts = ("NCHW", "NHWC") if args.layout == "both" else (args.layout,)
    for label, *dims in SHAPES:
        if args.only not in label:
            continue
        for op in OPS:
            if len(layouts) > 1:
                _layouts_timed(label, op, dims, args.rounds)
                continue
            graph = one_op_graph(op, op, *dims, layout=args.layout)
            node = graph.outputs[0]
            shape = conv_forms.conv_shape(op, [i.shape for i in node.inputs], node.shape, node.attr_dict, dims[0], 4)
            model = conv_forms.form_costs(op, shape, args.layout)
            measured = timed({form: compiled(op, dims, form, args.layout) for form in model}, args.rounds)
            best = min(measured, key=measured.__getitem__)
            for form in model:
                mark = ("model" if form == conv_forms.conv_form(op, shape, args.layout) else "") + \
                       (" fastest" if form == best else "")
                print(f"{label:14s} {op:20s} {form:7s} {measured[form] * 1e6:11.0f} {model[form] / 1e3:9.0f}  {mark}")


def _layouts_timed(label: str, op: str, dims: list[int], rounds: int) -> None:
    """Each form of ``op`` in NCHW and NHWC, timed interleaved, beside the model's costs."""
    from mlir_nn.ir import conv_forms

    costs, fns = {}, {}
    for layout in ("NCHW", "NHWC"):
        node = one_op_graph(op, op, *dims, layout=layout).outputs[0]
        shape = conv_forms.conv_shape(op, [i.shape for i in node.inputs], node.shape, node.attr_dict, dims[0], 4)
        costs[layout] = conv_forms.form_costs(op, shape, layout)
        fns.update({(form, layout): compiled(op, dims, form, layout) for form in costs[layout]})
    measured = timed(fns, rounds)
    for form in costs["NCHW"]:
        nchw, nhwc = measured[(form, "NCHW")], measured[(form, "NHWC")]
        print(f"{label:14s} {op:20s} {form:7s} NCHW {nchw * 1e6:8.0f} us NHWC {nhwc * 1e6:8.0f} us "
              f"({nhwc / nchw - 1:+.0%}); model {costs['NCHW'][form] / 1e3:8.0f} {costs['NHWC'][form] / 1e3:8.0f}")


if __name__ == "__main__":
    main()
