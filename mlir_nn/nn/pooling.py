"""Pooling layers with PyTorch's names and arguments (no parameters)."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor, adaptive_avg_pool2d, avg_pool2d, max_pool2d
from mlir_nn.nn.modules import Module


class _Pool(Module):
    def __call__(self, x: Any) -> Tensor:
        return self.forward(x)

    def forward(self, x: Any) -> Tensor:
        raise NotImplementedError

    def structure_tracked(self) -> bool:
        return True  # no parameters


class MaxPool2d(_Pool):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        if return_indices:
            raise NotImplementedError("MaxPool2d: return_indices=True is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Any) -> Tensor:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def __repr__(self) -> str:
        return f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size})"


class AvgPool2d(_Pool):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        if divisor_override is not None:
            raise NotImplementedError("AvgPool2d: divisor_override is not supported")
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Any) -> Tensor:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)

    def __repr__(self) -> str:
        return f"AvgPool2d(kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size})"


class AdaptiveAvgPool2d(_Pool):
    def __init__(self, output_size: Any) -> None:
        self.output_size = output_size

    def forward(self, x: Any) -> Tensor:
        return adaptive_avg_pool2d(x, self.output_size)

    def __repr__(self) -> str:
        return f"AdaptiveAvgPool2d(output_size={self.output_size})"
