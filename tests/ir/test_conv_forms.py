"""The convolution form chooser: each form where it is clearly cheaper (these would fail with the
choice inverted), the forced form of the calibration benchmark, and the e-graph's cost of a
convolution node being the cost of the form the code generator lowers it to."""

import pytest

from mlir_nn.egraph.cost import CostModel
from mlir_nn.ir import conv_forms
from mlir_nn.ir.windows import axes_of


def _shape(op, n, c, hw, o, k, stride=1, pad=0, groups=1, itemsize=4):
    attrs = dict(stride=(stride, stride), padding=(pad,) * 4, dilation=(1, 1), groups=groups)
    ys, xs = axes_of("conv2d", (hw, hw), (k, k), attrs)
    x, w, y = (n, c, hw, hw), (o, c // groups, k, k), (n, o, ys.out, xs.out)
    ins, out = {"conv2d": ([x, w], y), "conv2d_bias": ([x, w, (o,)], y), "conv2d_weight_grad": ([x, y], w),
                "conv2d_weight_update": ([x, y, w], w), "conv2d_input_grad": ([y, w], x)}[op]
    return conv_forms.conv_shape(op, ins, out, attrs, n, itemsize), ins, out, attrs


@pytest.mark.parametrize("op,dims,form", [
    ("conv2d", (64, 1, 28, 6, 5, 1, 2), "taps"),  # LeNet's first layer: 25 taps, rows of 28
    ("conv2d_weight_grad", (128, 3, 32, 32, 3, 1, 1), "taps"),  # VGG's first: 27 taps, rows of 32
    ("conv2d", (128, 32, 16, 64, 3, 1, 1), "gemm"),  # 288 taps
    ("conv2d", (64, 6, 14, 16, 5, 1, 0), "gemm"),  # 150 taps over rows of 10: lanes wasted
    ("conv2d_weight_grad", (32, 64, 14, 64, 1, 1, 0), "gemm"),  # 1x1
    ("conv2d", (16, 3, 64, 16, 7, 2, 3), "gemm"),  # stride 2: the tap sum's rows are strided
    ("conv2d", (32, 32, 16, 32, 3, 1, 1, 32), "taps"),  # depthwise
    ("conv2d_input_grad", (32, 32, 16, 32, 3, 1, 1, 32), "grouped"),
    ("conv2d_input_grad", (128, 32, 16, 64, 3, 1, 1), "col2im"),  # fewer input than output channels
    ("conv2d_input_grad", (32, 32, 16, 64, 3, 2, 1), "col2im"),  # stride 2: im2col would spread
    ("conv2d_input_grad", (32, 64, 14, 64, 1, 1, 0), "gemm"),  # 1x1: nothing to add back
    ("conv2d_input_grad", (8, 96, 12, 8, 3, 1, 1), "gemm"),  # many input channels for few output ones
])
def test_the_cheapest_form_is_picked(op, dims, form):
    s = _shape(op, *dims)[0]
    costs = conv_forms.form_costs(op, s)
    assert conv_forms.conv_form(op, s) == form
    assert all(costs[form] < cost for f, cost in costs.items() if f != form)


@pytest.mark.parametrize("op", conv_forms.CONV_OPS)
def test_grouped_convolutions_have_no_gemm_form(op):
    assert "gemm" not in conv_forms.form_costs(op, _shape(op, 4, 8, 9, 8, 3, groups=2)[0])


def test_float64_halves_the_rates():
    """Twice the bytes per element and half the lanes: every form costs about twice as much."""
    for op in ("conv2d", "conv2d_input_grad"):
        single, double = (conv_forms.form_costs(op, _shape(op, 32, 32, 16, 64, 3, 1, 1, itemsize=b)[0])
                          for b in (4, 8))
        assert all(1.5 < double[f] / single[f] <= 2.0 for f in single)


def test_a_forced_form_is_taken_where_available(monkeypatch):
    s = _shape("conv2d", 128, 32, 16, 64, 3, 1, 1)[0]
    monkeypatch.setenv(conv_forms.FORM_ENV, "taps")
    assert conv_forms.conv_form("conv2d", s) == "taps"
    monkeypatch.setenv(conv_forms.FORM_ENV, "col2im")  # no forward form: the cheapest
    assert conv_forms.conv_form("conv2d", s) == "gemm"


@pytest.mark.parametrize("op", conv_forms.CONV_OPS)
def test_the_egraph_prices_a_convolution_as_its_form(op):
    """The node's cost is its chosen form's (plus the launch and any fused epilogue), so a cheaper
    form or a larger batch shows in extraction; fused epilogues cost less than separate kernels."""
    model = CostModel(batch=64)
    s, ins, out, attrs = _shape(op, 64, 32, 16, 64, 3, 1, 1)
    cost = model.node_cost(op, attrs, ins, out, 4)
    form_ns = min(conv_forms.form_costs(op, s).values())
    assert cost >= conv_forms.BYTES_PER_NS * form_ns + model.launch
    assert cost < 1.1 * conv_forms.BYTES_PER_NS * form_ns + model.launch
    bigger = _shape(op, 128, 32, 16, 64, 3, 1, 1)
    assert model.node_cost(op, attrs, bigger[1], bigger[2], 4) > 1.5 * cost


def test_the_fused_bias_costs_less_than_the_convolution_and_its_epilogue_apart():
    model = CostModel(batch=64)
    s, ins, out, attrs = _shape("conv2d_bias", 64, 32, 16, 64, 3, 1, 1)
    fused = model.node_cost("conv2d_bias", {**attrs, "activation": "relu"}, ins, out, 4)
    apart = (model.node_cost("conv2d", attrs, ins[:2], out, 4) + model.node_cost("add", {}, [out, (64, 1, 1)], out, 4)
             + model.node_cost("relu", {}, [out], out, 4))
    assert fused < apart
