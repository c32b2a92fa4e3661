"""A GPT: token and position embeddings, pre-LayerNorm blocks of causal self-attention and a
GELU MLP, a final LayerNorm and a linear head (nanoGPT's structure and parameter names, so a
PyTorch twin's ``state_dict`` loads directly)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, arange
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import fmt_shape
from mlir_nn.nn import functional as F
from mlir_nn.nn.activation import GELU
from mlir_nn.nn.attention import CausalSelfAttention, linear
from mlir_nn.nn.container import ModuleList
from mlir_nn.nn.dropout import Dropout
from mlir_nn.nn.linear import Linear
from mlir_nn.nn.module import Module
from mlir_nn.nn.normalization import LayerNorm
from mlir_nn.nn.sparse import Embedding


class MLP(Module):
    """Linear(C, 4C), GELU, Linear(4C, C), dropout."""

    def __init__(self, n_embd: int, dropout: float = 0.0, dtype: Any = np.float32) -> None:
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, dtype=dtype)
        self.gelu = GELU()
        self.c_proj = Linear(4 * n_embd, n_embd, dtype=dtype)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(linear(self.gelu(linear(x, self.c_fc)), self.c_proj))


class Block(Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, dtype: Any = np.float32) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, dtype=dtype)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, dtype=dtype)
        self.ln_2 = LayerNorm(n_embd, dtype=dtype)
        self.mlp = MLP(n_embd, dropout, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    """Logits (B, T, vocab_size) for token indices (B, T) with T <= block_size."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 2, n_head: int = 4, n_embd: int = 64,
                 dropout: float = 0.0, dtype: Any = np.float32) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = Embedding(vocab_size, n_embd, dtype=dtype)
        self.wpe = Embedding(block_size, n_embd, dtype=dtype)
        self.drop = Dropout(dropout)
        self.h = ModuleList([Block(n_embd, n_head, dropout, dtype=dtype) for _ in range(n_layer)])
        self.ln_f = LayerNorm(n_embd, dtype=dtype)
        self.lm_head = Linear(n_embd, vocab_size, bias=False, dtype=dtype)
        for name, p in self.named_parameters():  # GPT-2's initialization
            if name.endswith("weight") and p.ndim == 2:
                std = 0.02 / np.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                p.data = np.random.normal(0.0, std, p.shape)
            elif name.endswith("bias") and "ln_" not in name:
                p.data = np.zeros(p.shape)

    def forward(self, idx: Any) -> Tensor:
        idx = idx if isinstance(idx, Tensor) else Tensor(np.asarray(idx), dtype=self.wte.weight.dtype)
        if idx.ndim != 2 or not 0 < idx.shape[1] <= self.block_size:
            raise ShapeError(f"GPT: input has shape {fmt_shape(idx.shape)}, expected (batch, T) with "
                             f"T <= {self.block_size}")
        x = self.drop(self.wte(idx) + self.wpe(arange(idx.shape[1])))
        for block in self.h:
            x = block(x)
        return linear(self.ln_f(x), self.lm_head)

    def loss(self, idx: Any, targets: Any) -> Tensor:
        """Mean cross-entropy of the next-token predictions."""
        return next_token_loss(self(idx), targets)


def next_token_loss(logits: Tensor, targets: Any) -> Tensor:
    """Mean cross-entropy of logits (batch, T, vocabulary) against targets (batch, T): a loss for
    ``train_step`` that is ``GPT.loss`` after the forward."""
    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), targets.reshape(b * t))
