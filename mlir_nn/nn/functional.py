"""``mlir_nn.nn.functional`` (``F``): the functional forms of layers, activations and losses,
with PyTorch's names and semantics."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from mlir_nn import engine
from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import BATCH, ShapeError
from mlir_nn.ir.shapes import fmt_shape, normalize_axes
from mlir_nn.losses import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)
from mlir_nn.nn.generator import draw_inputs


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


__all__ = ["cross_entropy", "log_softmax", "mse_loss", "relu", "sigmoid", "softmax", "tanh"]


# ---------------------------------------------------------------------------- layers (issue 21a)


def linear(x: Any, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with ``weight`` of shape (out_features, in_features); ``x`` of shape
    (*, in_features) (more than 2 dims: the leading ones are flattened into rows and restored)."""
    x = _tensor(x)
    if x.ndim > 2:
        lead = x.shape[:-1]
        if BATCH in lead and any(d not in (BATCH, 1) for d in lead):
            raise ShapeError(f"linear: input {fmt_shape(x.shape)} has the traced batch dimension among others "
                             "larger than 1 (trace with jit(..., dynamic_batch=False))")
        rows: int | str = BATCH if BATCH in lead else int(np.prod(lead, dtype=np.int64))
        return linear(x.reshape(rows, x.shape[-1]), weight, bias).reshape(lead + (weight.shape[0],))
    out = x @ weight.T
    return out if bias is None else out + bias


def leaky_relu(x: Any, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, else negative_slope * x."""
    x = _tensor(x)
    return x.relu() - negative_slope * (-x).relu()


def gelu(x: Any, approximate: str = "none") -> Tensor:
    """x * Phi(x) with Phi the standard normal CDF (through erf), or its tanh approximation."""
    x = _tensor(x)
    if approximate == "none":
        return x * 0.5 * (1.0 + apply("erf", x * _SQRT1_2))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + (_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def silu(x: Any) -> Tensor:
    """x * sigmoid(x)."""
    x = _tensor(x)
    return x * x.sigmoid()


def erf(x: Any) -> Tensor:
    return apply("erf", _tensor(x))


def dropout(x: Any, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1 - p) (when ``training``).

    Masks come from Philox-4x32-10 under ``mlir_nn.manual_seed`` (``mlir_nn.nn.generator``):
    the same on every backend, fresh on every call, also inside a compiled step.
    """
    p = _probability("dropout", p)
    x = _tensor(x)
    if not training or p == 0.0:
        return x
    chunks, slot = draw_inputs(x.dtype)
    return apply("dropout", x, *chunks, p=p, slot=slot)


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dimensions start_dim..end_dim merged into one."""
    x = _tensor(x)
    shape = x.shape
    if not shape:
        return x.reshape(1)
    start, end = normalize_axes("flatten", start_dim, len(shape))[0], normalize_axes("flatten", end_dim, len(shape))[0]
    if start > end:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {fmt_shape(shape)}")
    merged = shape[start:end + 1]
    if BATCH in merged:  # the run-time batch merges only with dimensions of size 1
        if any(d not in (BATCH, 1) for d in merged):
            raise ShapeError(f"flatten: cannot merge the traced batch dimension of {fmt_shape(shape)} with "
                             "dimensions larger than 1 (trace with jit(..., dynamic_batch=False))")
        size: int | str = BATCH
    else:
        size = int(np.prod(merged, dtype=np.int64))
    return x.reshape(shape[:start] + (size,) + shape[end + 1:])


def layer_norm(x: Any, normalized_shape: int | tuple[int, ...], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` dims (biased variance), then scale and shift."""
    x = _tensor(x)
    normalized = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not normalized or tuple(x.shape[x.ndim - len(normalized):]) != normalized or x.ndim < len(normalized):
        raise ShapeError(f"layer_norm: input has shape {fmt_shape(x.shape)}, expected it to end with "
                         f"{fmt_shape(normalized)}")
    if len(normalized) == 1:
        out = apply("layer_norm", x, eps=float(eps))  # one kernel each way
    else:
        out = _normalize(x, tuple(range(x.ndim - len(normalized), x.ndim)), eps)
    if weight is not None:
        out = out * weight
    return out if bias is None else out + bias


def batch_norm(x: Any, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float | Tensor = 0.1,
               eps: float = 1e-5) -> Tensor:
    """Normalize each channel (axis 1) of (N, C) or (N, C, L) input: by the batch statistics when
    ``training`` (then the running ones move by ``momentum``, in place: inside a compiled step
    too, with the unbiased batch variance), else by ``running_mean`` and ``running_var``."""
    x = _tensor(x)
    if x.ndim not in (2, 3):
        raise ShapeError(f"batch_norm: input has shape {fmt_shape(x.shape)}, expected (N, C) or (N, C, L)")
    channels = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and t.shape != (channels,):
            raise ShapeError(f"batch_norm: {name} has shape {fmt_shape(t.shape)}, expected ({channels},) for input "
                             f"{fmt_shape(x.shape)}")
    axes = (0,) if x.ndim == 2 else (0, 2)
    per_channel = (channels,) if x.ndim == 2 else (channels, 1)
    if training:
        values = int(np.prod([x.shape[a] for a in axes if x.shape[a] != BATCH], dtype=np.int64))
        if values == 1 and BATCH not in [x.shape[a] for a in axes]:
            raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got input "
                             f"{fmt_shape(x.shape)}")
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) * (x - mean)).mean(axis=axes, keepdims=True)
        if running_mean is not None and running_var is not None:
            n = apply("numel", x, axes=axes)
            unbiased = var.reshape(channels) * (n / (n - 1.0))
            running_mean.assign((1.0 - momentum) * running_mean + momentum * mean.reshape(channels))
            running_var.assign((1.0 - momentum) * running_var + momentum * unbiased)
        out = (x - mean) / (var + eps).sqrt()
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm: running_mean and running_var are needed when not training")
        out = (x - running_mean.reshape(per_channel)) / (running_var.reshape(per_channel) + eps).sqrt()
    if weight is not None:
        out = out * weight.reshape(per_channel)
    return out if bias is None else out + bias.reshape(per_channel)


def _normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    return centered / (var + eps).sqrt()


def _probability(owner: str, p: Any) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{owner}: probability has to be between 0 and 1, but got {p!r}")
    return float(p)


_SQRT1_2 = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

__all__ += ["batch_norm", "dropout", "erf", "flatten", "gelu", "layer_norm", "leaky_relu", "linear", "silu"]


# ---------------------------------------------------------------------------- sequence models (issue 23)


def embedding(input: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer tensor ``input``: shape
    ``input.shape + (dim,)``; the gradient adds up into the picked rows (dense, as PyTorch's default)."""
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D (num_embeddings, dim), got {fmt_shape(weight.shape)}")
    return weight[input if isinstance(input, Tensor) else np.asarray(input)]


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over the last two axes, as PyTorch's: ``is_causal``
    hides keys after each query; a boolean ``attn_mask`` keeps where True, a float one is added.
    A causal mask over static lengths is the softmax's own (``causal``: no mask tensor, and the
    compiled products skip what it hides)."""
    length, source = query.shape[-2], key.shape[-2]
    scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal, not both")
    if is_causal and BATCH not in (length, source):
        weights = apply("softmax", scores, axis=scores.ndim - 1, causal=True)
    else:
        if is_causal:
            attn_mask = np.tril(np.ones((length, source), bool))
        if attn_mask is not None:
            mask = attn_mask.data if isinstance(attn_mask, Tensor) and attn_mask._data is not None else attn_mask
            if isinstance(mask, np.ndarray) and mask.dtype == bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask
        weights = scores.softmax(-1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ value


__all__ += ["embedding", "scaled_dot_product_attention"]
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


__all__ += ["adaptive_avg_pool2d", "avg_pool2d", "conv2d", "max_pool2d", "pad"]
# ---------------------------------------------------------------------------- losses (issue 21b)


def softplus(x: Any) -> Tensor:
    """log(1 + exp(x)), finite for any finite x (PyTorch's ``threshold`` shortcut is not taken)."""
    return apply("softplus", _tensor(x))


__all__ += ["binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss", "l1_loss", "nll_loss",
            "smooth_l1_loss", "softplus"]  # losses (issue 21b)
