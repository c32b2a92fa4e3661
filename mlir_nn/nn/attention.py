"""Attention layers: ``nn.MultiheadAttention`` (PyTorch's parameters and semantics) and the
causal self-attention block of GPT models."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape
from mlir_nn.nn import functional as F
from mlir_nn.nn.linear import Linear, positive, uniform
from mlir_nn.nn.module import Module, Parameter


def linear(x: Tensor, layer: Linear) -> Tensor:
    """``layer`` applied over the last axis of an input of any rank."""
    return F.linear(x, layer.weight, layer.bias)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, C) -> (B, heads, T, C // heads)."""
    b, t, c = x.shape
    return x.view(b, t, heads, c // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, heads, T, D) -> (B, T, heads * D)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class MultiheadAttention(Module):
    """PyTorch's ``nn.MultiheadAttention`` (same parameters: ``in_proj_weight`` (3E, E),
    ``in_proj_bias``, ``out_proj``) for query, key and value of one width E.

    ``forward(query, key, value, attn_mask=None, need_weights=True, is_causal=False)`` returns
    ``(output, weights averaged over heads or None)``; inputs are (L, B, E), or (B, L, E) with
    ``batch_first``. A boolean ``attn_mask`` hides where True, as PyTorch's.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, dtype: Any = np.float32) -> None:
        super().__init__()
        positive("MultiheadAttention", embed_dim=embed_dim, num_heads=num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        bound = float(np.sqrt(6.0 / (embed_dim + 3 * embed_dim)))  # Xavier-uniform, as PyTorch's
        self.in_proj_weight = Parameter(uniform((3 * embed_dim, embed_dim), bound), dtype=dtype)
        if bias:
            self.in_proj_bias = Parameter(np.zeros(3 * embed_dim), dtype=dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if bias:
            self.out_proj.bias = Parameter(np.zeros(embed_dim), dtype=dtype, label="bias")

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None, need_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        if not (query.ndim == key.ndim == value.ndim == 3) or query.shape[-1] != self.embed_dim:
            raise ShapeError(f"MultiheadAttention: expected 3-D query, key and value of width {self.embed_dim}, got "
                             f"{fmt_shape(query.shape)}, {fmt_shape(key.shape)}, {fmt_shape(value.shape)}")
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        e = self.embed_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        q, k, v = (x @ w[i * e:(i + 1) * e].T + (0.0 if b is None else b[i * e:(i + 1) * e])
                   for i, x in enumerate((query, key, value)))
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))
        length, source = q.shape[-2], k.shape[-2]
        if is_causal and attn_mask is None:
            attn_mask = np.triu(np.ones((length, source), bool), 1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / float(np.sqrt(e // self.num_heads)))
        if attn_mask is not None:
            mask = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
            scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == bool else scores + mask
        weights = scores.softmax(-1)
        if self.dropout > 0.0 and self.training:
            weights = F.dropout(weights, self.dropout)
        out = linear(merge_heads(weights @ v), self.out_proj)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, (weights.mean(axis=1) if need_weights else None)


class CausalSelfAttention(Module):
    """GPT's attention block: one (C, 3C) projection to queries, keys and values, causal
    scaled dot-product attention over ``n_head`` heads, an output projection (nanoGPT's names)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 dtype: Any = np.float32) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"CausalSelfAttention: n_embd {n_embd} is not divisible by n_head {n_head}")
        self.n_embd, self.n_head, self.dropout = n_embd, n_head, dropout
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias, dtype=dtype)
        self.c_proj = Linear(n_embd, n_embd, bias=bias, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ShapeError(f"CausalSelfAttention: input has shape {fmt_shape(x.shape)}, "
                             f"expected (B, T, {self.n_embd})")
        q, k, v = (split_heads(t, self.n_head) for t in linear(x, self.c_attn).split(self.n_embd, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return linear(merge_heads(y), self.c_proj)
