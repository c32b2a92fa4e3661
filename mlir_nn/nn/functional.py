"""``mlir_nn.nn.functional`` (``F``): the functional forms of layers, activations and losses,
with PyTorch's names and semantics."""

from __future__ import annotations

from typing import Any

from mlir_nn import engine
from mlir_nn.engine import Tensor
from mlir_nn.losses import cross_entropy, mse_loss


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def relu(x: Any) -> Tensor:
    return _tensor(x).relu()


def tanh(x: Any) -> Tensor:
    return _tensor(x).tanh()


def sigmoid(x: Any) -> Tensor:
    return _tensor(x).sigmoid()


def softmax(x: Any, dim: int = -1) -> Tensor:
    return _tensor(x).softmax(axis=dim)


def log_softmax(x: Any, dim: int = -1) -> Tensor:
    return _tensor(x).log_softmax(axis=dim)


# ---------------------------------------------------------------------------- convolution, pooling, pad (issue 22)


def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Tensor:
    """NCHW cross-correlation; weight (out, in/groups, kh, kw); padding an int, a pair, "same" or "valid"."""
    return engine.conv2d(input, weight, bias, stride, padding, dilation, groups)


def max_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
    if return_indices:
        raise NotImplementedError("max_pool2d: return_indices=True is not supported (the indices stay inside the op)")
    return engine.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)


def avg_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    if divisor_override is not None:
        raise NotImplementedError("avg_pool2d: divisor_override is not supported")
    return engine.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Tensor:
    return engine.adaptive_avg_pool2d(input, output_size)


def pad(input: Any, pad: Any, mode: str = "constant", value: float | None = None) -> Tensor:
    """Constant padding, ``pad`` = (last_lo, last_hi, second_last_lo, ...) as PyTorch; negative amounts crop."""
    if mode != "constant":
        raise NotImplementedError(f"pad: mode {mode!r} is not supported; only 'constant'")
    return engine.pad(input, pad, 0.0 if value is None else value)


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "conv2d", "cross_entropy", "log_softmax", "max_pool2d", "mse_loss",
           "pad", "relu", "sigmoid", "softmax", "tanh"]
