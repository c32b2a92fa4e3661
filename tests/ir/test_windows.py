"""The window ops (conv2d, pooling, pad): forward and gradients equal PyTorch's in float64,
VJPs against finite differences, and clear errors for shapes that do not fit."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError
from mlir_nn.nn import functional as F
from tests.gradcheck import check_grads

TOL = dict(rtol=1e-10, atol=1e-10)


def same_as_torch(ours, theirs, arrays):
    """Forward and every input gradient of ``ours`` equal ``theirs`` (float64)."""
    mine = [Tensor(a) for a in arrays]
    ref = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, yt = ours(*mine), theirs(*ref)
    np.testing.assert_allclose(y.data, yt.detach().numpy(), **TOL)
    weight = np.random.default_rng(3).standard_normal(y.shape)
    (y * Tensor(weight)).sum().backward()
    (yt * torch.tensor(weight)).sum().backward()
    for a, b in zip(mine, ref):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), **TOL)


@st.composite
def conv_cases(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cin = groups * draw(st.integers(1, 2))
    cout = groups * draw(st.integers(1, 2))
    depthwise = draw(st.booleans())
    if depthwise:
        groups, cout = cin, cin * draw(st.integers(1, 2))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = draw(st.sampled_from([0, 1, (1, 0), "same", "valid"]))
    stride = 1 if padding == "same" else (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    span = [d * (k - 1) + 1 for d, k in zip(dilation, kernel)]
    hw = (draw(st.integers(span[0], span[0] + 4)), draw(st.integers(span[1], span[1] + 4)))
    return dict(batch=draw(st.sampled_from([1, 2])), cin=cin, cout=cout, hw=hw, kernel=kernel, stride=stride,
                padding=padding, dilation=dilation, groups=groups, bias=draw(st.booleans()))


@settings(max_examples=25, deadline=None)
@given(case=conv_cases(), seed=st.integers(0, 2**31))
def test_conv2d_equals_pytorch(case, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((case["batch"], case["cin"]) + case["hw"]),
              rng.standard_normal((case["cout"], case["cin"] // case["groups"]) + case["kernel"])]
    if case["bias"]:
        arrays.append(rng.standard_normal(case["cout"]))
    kw = {k: case[k] for k in ("stride", "padding", "dilation", "groups")}
    same_as_torch(lambda *t: F.conv2d(*t, **kw), lambda *t: TF.conv2d(*t, **kw), arrays)


@settings(max_examples=25, deadline=None)
@given(batch=st.sampled_from([1, 2]), channels=st.integers(1, 3), kernel=st.integers(1, 3),
       stride=st.sampled_from([None, 1, 2, (2, 1)]), padding=st.integers(0, 1), dilation=st.integers(1, 2),
       ceil_mode=st.booleans(), extra=st.tuples(st.integers(0, 4), st.integers(0, 4)),
       ties=st.booleans(), seed=st.integers(0, 2**31))
def test_max_pool2d_equals_pytorch_ties_included(batch, channels, kernel, stride, padding, dilation, ceil_mode,
                                                 extra, ties, seed):
    padding = min(padding, kernel // 2)
    span = dilation * (kernel - 1) + 1
    x = np.random.default_rng(seed).standard_normal((batch, channels, span + extra[0], span + extra[1]))
    x = np.round(x) if ties else x  # many equal maxima: the gradient goes to the first one, as PyTorch
    kw = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    same_as_torch(lambda t: F.max_pool2d(t, **kw), lambda t: TF.max_pool2d(t, **kw), [x])


@settings(max_examples=25, deadline=None)
@given(batch=st.sampled_from([1, 2]), channels=st.integers(1, 3),
       kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)), stride=st.sampled_from([None, 1, 2, (1, 2)]),
       padding=st.integers(0, 1), ceil_mode=st.booleans(),
       count_include_pad=st.booleans(), extra=st.tuples(st.integers(0, 4), st.integers(0, 4)),
       seed=st.integers(0, 2**31))
def test_avg_pool2d_equals_pytorch(batch, channels, kernel, stride, padding, ceil_mode, count_include_pad, extra,
                                   seed):
    padding = min(padding, min(kernel) // 2)
    x = np.random.default_rng(seed).standard_normal((batch, channels, kernel[0] + extra[0], kernel[1] + extra[1]))
    kw = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
              count_include_pad=count_include_pad)
    same_as_torch(lambda t: F.avg_pool2d(t, **kw), lambda t: TF.avg_pool2d(t, **kw), [x])


@pytest.mark.parametrize("hw,out", [((7, 7), 1), ((5, 7), (3, 2)), ((8, 6), (4, 3)), ((6, 5), (None, 2)),
                                    ((1, 1), (3, 2)), ((3, 10), (2, 4))])
def test_adaptive_avg_pool2d_equals_pytorch(hw, out):
    x = np.random.default_rng(0).standard_normal((2, 3) + hw)
    same_as_torch(lambda t: F.adaptive_avg_pool2d(t, out), lambda t: TF.adaptive_avg_pool2d(t, out), [x])


@pytest.mark.parametrize("pads", [(1, 2), (1, 0, 2, 1), (-1, 2, 0, -2), (0, 0, 1, 1, 1, 0)])
def test_pad_equals_pytorch(pads):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    same_as_torch(lambda t: F.pad(t, pads, value=0.5), lambda t: TF.pad(t, pads, value=0.5), [x])


def test_unbatched_images_as_pytorch():
    x, w = np.random.default_rng(0).standard_normal((2, 5, 5)), np.random.default_rng(1).standard_normal((3, 2, 3, 3))
    same_as_torch(lambda a, b: F.max_pool2d(F.conv2d(a, b, padding=1), 2),
                  lambda a, b: TF.max_pool2d(TF.conv2d(a, b, padding=1), 2), [x, w])


CONV = dict(stride=(2, 1), padding=(1, 0, 0, 1), dilation=(1, 2), groups=2)


@pytest.mark.parametrize("build,shapes", [
    (lambda x, w: apply("conv2d", x, w, **CONV), [(2, 4, 5, 4), (4, 2, 2, 2)]),
    (lambda g, w: apply("conv2d_input_grad", g, w, input_hw=(5, 4), **CONV), [(2, 4, 3, 3), (4, 2, 2, 2)]),
    (lambda x, g: apply("conv2d_weight_grad", x, g, kernel=(2, 2), **CONV), [(2, 4, 5, 4), (2, 4, 3, 3)]),
    (lambda x: apply("avg_pool2d", x, kernel=(2, 3), stride=(1, 2), padding=(1, 1, 1, 1), ceil_mode=True,
                     count_include_pad=False), [(1, 2, 4, 5)]),
    (lambda g: apply("avg_pool2d_grad", g, input_hw=(4, 5), kernel=(2, 3), stride=(1, 2), padding=(1, 1, 1, 1),
                     ceil_mode=True, count_include_pad=False), [(1, 2, 5, 3)]),
    (lambda x: apply("adaptive_avg_pool2d", x, output_size=(2, 3)), [(2, 1, 3, 4)]),
    (lambda g: apply("adaptive_avg_pool2d_grad", g, input_hw=(3, 4)), [(2, 1, 2, 3)]),
    (lambda x: apply("pad", x, pads=((0, 0), (1, -1), (2, 1)), value=1.5), [(2, 3, 4)]),
    (lambda x: F.max_pool2d(x, 2, 1, padding=1), [(1, 2, 3, 4)]),
])
def test_vjps_against_finite_differences(build, shapes):
    rng = np.random.default_rng(0)
    check_grads(build, [rng.standard_normal(s) for s in shapes])


def test_shape_errors_name_the_op_and_shapes():
    x, w = Tensor(np.zeros((2, 3, 5, 5))), Tensor(np.zeros((4, 2, 3, 3)))
    with pytest.raises(ShapeError, match=r"conv2d: weight \(4, 2, 3, 3\) expects 2 input channels"):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match="groups=2 must divide in_channels"):
        F.conv2d(x, w, groups=2)
    with pytest.raises(ShapeError, match="input must be"):
        F.conv2d(Tensor(np.zeros((3, 5))), w)
    with pytest.raises(ShapeError, match="smaller than the window"):
        F.conv2d(Tensor(np.zeros((1, 2, 2, 2))), w)
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        F.conv2d(Tensor(np.zeros((1, 2, 5, 5))), w, stride=2, padding="same")
    with pytest.raises(ShapeError, match=r"bias has shape \(3,\), expected \(4,\)"):
        F.conv2d(Tensor(np.zeros((1, 2, 5, 5))), w, bias=np.zeros(3))
    with pytest.raises(ValueError, match="at most half the kernel"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="kernel_size must be an int or a pair"):
        F.avg_pool2d(x, (1, 2, 3))
    with pytest.raises(ShapeError, match="crop all of an axis"):
        F.pad(x, (-3, -2))
    with pytest.raises(NotImplementedError, match="reflect"):
        F.pad(x, (1, 1), mode="reflect")
