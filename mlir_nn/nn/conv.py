"""Convolution layers with PyTorch's names, shapes, initialization and state_dict keys."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, conv2d
from mlir_nn.nn.linear import as_input, uniform
from mlir_nn.nn.module import Module, Parameter


def _pair(name: str, value: Any) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(f"Conv2d: {name} must be a positive int or a pair of them, got {value!r}")
    return pair  # type: ignore[return-value]


class Conv2d(Module):
    """2-D convolution over NCHW inputs: ``weight`` (out, in/groups, kh, kw), ``bias`` (out,).

    Initialization is PyTorch's: weight and bias uniform in +-1/sqrt(fan_in) with
    fan_in = in_channels / groups * kh * kw (``kaiming_uniform_(a=sqrt(5))``).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 dtype: Any = np.float32) -> None:
        super().__init__()
        if padding_mode != "zeros":
            raise NotImplementedError(f"Conv2d: padding_mode {padding_mode!r} is not supported; only 'zeros'")
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: groups={groups} must divide in_channels ({in_channels}) and "
                             f"out_channels ({out_channels})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair("kernel_size", kernel_size)
        self.stride, self.dilation = _pair("stride", stride), _pair("dilation", dilation)
        self.padding = padding if isinstance(padding, str) else _pair_or_zero(padding)
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in)
        shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(uniform(shape, bound), dtype=dtype, label="weight")
        if bias:
            self.bias = Parameter(uniform((out_channels,), bound), dtype=dtype, label="bias")
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Any) -> Tensor:
        x = as_input(x, self.weight.dtype)
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}" + (f", groups={self.groups}" if self.groups != 1 else "")
                + (", bias=False" if self.bias is None else ""))


def _pair_or_zero(value: Any) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 0 for v in pair):
        raise ValueError(f"Conv2d: padding must be a non-negative int, a pair, 'same' or 'valid', got {value!r}")
    return pair  # type: ignore[return-value]
