"""``nn.Embedding``: a lookup table of vectors indexed by integer tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.nn import functional as F
from mlir_nn.nn.linear import positive
from mlir_nn.nn.module import Module, Parameter


class Embedding(Module):
    """``weight[input]`` with ``weight`` (num_embeddings, embedding_dim) drawn from N(0, 1), as PyTorch.

    The input holds integers (any shape; fed to a compiled step in the model's dtype and checked
    before each call); the gradient is a dense scatter-add into the picked rows.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: Any = np.float32) -> None:
        super().__init__()
        positive("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.weight = Parameter(np.random.standard_normal((self.num_embeddings, self.embedding_dim)), dtype=dtype,
                                label="weight")

    def forward(self, input: Any) -> Tensor:
        return F.embedding(input, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
