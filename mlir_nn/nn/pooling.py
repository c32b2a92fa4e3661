"""Pooling layers with PyTorch's names and arguments (no parameters)."""

from __future__ import annotations

from typing import Any

from mlir_nn.engine import Tensor, adaptive_avg_pool2d, avg_pool2d, max_pool2d
from mlir_nn.nn.module import Module


class MaxPool2d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                 return_indices: bool = False, ceil_mode: bool = False) -> None:
        if return_indices:
            raise NotImplementedError("MaxPool2d: return_indices=True is not supported")
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Any) -> Tensor:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}"


class AvgPool2d(Module):
    def __init__(self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        if divisor_override is not None:
            raise NotImplementedError("AvgPool2d: divisor_override is not supported")
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Any) -> Tensor:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Tensor:
        return adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
