"""``mlir_nn.nn.functional`` (``F``): the functional forms of layers, activations and losses,
with PyTorch's names and semantics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape
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


__all__ = ["cross_entropy", "log_softmax", "mse_loss", "relu", "sigmoid", "softmax", "tanh"]


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
    hides keys after each query; a boolean ``attn_mask`` keeps where True, a float one is added."""
    length, source = query.shape[-2], key.shape[-2]
    scores = (query @ key.transpose(-2, -1)) * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    if is_causal:
        if attn_mask is not None:
            raise ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal, not both")
        attn_mask = np.tril(np.ones((length, source), bool))
    if attn_mask is not None:
        mask = attn_mask.data if isinstance(attn_mask, Tensor) and attn_mask._data is not None else attn_mask
        if isinstance(mask, np.ndarray) and mask.dtype == bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = scores.softmax(-1)
    if dropout_p > 0.0:
        raise NotImplementedError("scaled_dot_product_attention: dropout_p > 0 needs nn.functional.dropout")
    return weights @ value


__all__ += ["embedding", "scaled_dot_product_attention"]
