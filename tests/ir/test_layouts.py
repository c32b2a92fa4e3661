"""The NHWC forms of the forward window ops (``layout="NHWC"``): values and gradients equal
PyTorch's on the permuted image in float64, and layouts or shapes that do not fit are clear errors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError, make_node
from mlir_nn.ir.layouts import TO_NCHW, TO_NHWC, layout_shape, nchw_shape
from tests.ir.test_windows import same_as_torch

CONV = dict(stride=(2, 1), padding=(1, 1, 0, 1), dilation=(1, 2), groups=1)


def _nhwc(torch_op):
    """``torch_op`` over an NHWC image: the image permuted to NCHW and the result back."""
    return lambda x, *rest: torch_op(x.permute(*TO_NCHW), *rest).permute(*TO_NHWC)


@pytest.mark.parametrize("batch,c,hw,o,groups", [(1, 1, (13, 13), 3, 1), (7, 3, (5, 7), 5, 1),
                                                 (2, 5, (13, 13), 5, 5)])
def test_nhwc_convolution_and_its_gradients_equal_pytorch(batch, c, hw, o, groups):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + hw + (c,))
    w = rng.standard_normal((o, c // groups, 3, 2))
    attrs = dict(CONV, groups=groups)
    same_as_torch(lambda xt, wt: apply("conv2d", xt, wt, layout="NHWC", **attrs),
                  _nhwc(lambda xt, wt: TF.conv2d(TF.pad(xt, (0, 1, 1, 1)), wt, stride=(2, 1), dilation=(1, 2),
                                                 groups=groups)), [x, w])


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_nhwc_pools_and_their_gradients_equal_pytorch(op):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7, 5, 4))
    if op == "max_pool2d":
        attrs = dict(kernel=(3, 2), stride=(2, 1), padding=(1, 1, 1, 1), dilation=(1, 1), ceil_mode=True)
        theirs = _nhwc(lambda t: TF.max_pool2d(t, (3, 2), (2, 1), (1, 1), ceil_mode=True))
    else:
        attrs = dict(kernel=(3, 2), stride=(2, 1), padding=(1, 1, 1, 1), ceil_mode=False, count_include_pad=False)
        theirs = _nhwc(lambda t: TF.avg_pool2d(t, (3, 2), (2, 1), (1, 1), count_include_pad=False))
    same_as_torch(lambda t: apply(op, t, layout="NHWC", **attrs), theirs, [x])


def test_nhwc_convolution_with_bias_equals_the_nchw_one_transposed():
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 6, 5, 3)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    attrs = dict(CONV, activation="relu")
    nhwc = apply("conv2d_bias", Tensor(x), Tensor(w), Tensor(b), layout="NHWC", **attrs)
    nchw = apply("conv2d_bias", Tensor(x.transpose(TO_NCHW)), Tensor(w), Tensor(b), **attrs)
    np.testing.assert_allclose(nhwc.data, nchw.data.transpose(TO_NHWC), rtol=1e-12)


def test_layout_shapes_round_trip():
    assert layout_shape((2, 3, 5, 7), "NHWC") == (2, 5, 7, 3)
    assert nchw_shape((2, 5, 7, 3), "NHWC") == (2, 3, 5, 7)
    assert nchw_shape((2, 3, 5, 7), "NCHW") == (2, 3, 5, 7)


def _leaf(shape):
    return make_node("input", [], name="x", shape=shape, dtype="float64")


def test_unknown_layouts_and_misfit_nhwc_shapes_are_clear_errors():
    w = make_node("param", [], name="w", shape=(4, 3, 3, 3), dtype="float64")
    with pytest.raises(ValueError, match="conv2d: unknown layout 'CHWN'"):
        make_node("conv2d", [_leaf(("N", 3, 8, 8)), w], layout="CHWN", **CONV)
    with pytest.raises(ShapeError, match=r"expects 3 input channels .* has 8"):  # an NCHW image read as NHWC
        make_node("conv2d", [_leaf(("N", 3, 8, 8)), w], layout="NHWC", **CONV)
    with pytest.raises(ShapeError, match=r"max_pool2d: operand 0 must be NHWC"):
        make_node("max_pool2d", [_leaf(("N", 8, 8))], kernel=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0),
                  dilation=(1, 1), ceil_mode=False, layout="NHWC")
    b = make_node("param", [], name="b", shape=(5,), dtype="float64")
    with pytest.raises(ShapeError, match=r"conv2d_bias: bias has shape \(5,\), expected \(4,\)"):
        make_node("conv2d_bias", [_leaf(("N", 8, 8, 3)), w, b], layout="NHWC", activation="none", **CONV)


def test_torch_reference_of_the_helper_is_torchs_nhwc_conv():
    """The permuting helper is PyTorch's own channels-last result (a check of the test's oracle)."""
    x = torch.randn(2, 6, 5, 3, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    want = TF.conv2d(x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last), w).permute(0, 2, 3, 1)
    torch.testing.assert_close(_nhwc(TF.conv2d)(x, w), want)
