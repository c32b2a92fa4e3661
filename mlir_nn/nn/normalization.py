"""``nn.LayerNorm`` and ``nn.BatchNorm1d`` with PyTorch's parameters, buffers and defaults.

BatchNorm1d keeps ``running_mean``, ``running_var`` and ``num_batches_tracked`` as buffers:
in training mode it normalizes by the batch statistics and moves the running ones (unbiased
variance, ``momentum``; a cumulative average when ``momentum`` is None) with
``Tensor.assign``, so a compiled step updates them in place like parameters; in eval mode
it normalizes by the running ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor
from mlir_nn.nn import functional as F
from mlir_nn.nn.linear import as_input, positive
from mlir_nn.nn.module import Module, Parameter
from mlir_nn.support.domains import COUNT, NON_NEGATIVE


class LayerNorm(Module):
    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype: Any = np.float32) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        positive("LayerNorm", **{f"normalized_shape[{i}]": d for i, d in enumerate(shape)})
        self.normalized_shape, self.eps, self.elementwise_affine = shape, float(eps), elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(np.ones(shape), dtype=dtype, label="weight")
            if bias:
                self.bias = Parameter(np.zeros(shape), dtype=dtype, label="bias")
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self._dtype = np.dtype(dtype).name

    def forward(self, x: Any) -> Tensor:
        return F.layer_norm(as_input(x, self._dtype), self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class BatchNorm1d(Module):
    STATE_DOMAINS = {"running_var": NON_NEGATIVE, "num_batches_tracked": COUNT}

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype: Any = np.float32) -> None:
        super().__init__()
        positive("BatchNorm1d", num_features=num_features)
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(np.ones(num_features), dtype=dtype, label="weight")
            self.bias = Parameter(np.zeros(num_features), dtype=dtype, label="bias")
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(num_features), dtype=dtype, label="running_mean"))
            self.register_buffer("running_var", Tensor(np.ones(num_features), dtype=dtype, label="running_var"))
            self.register_buffer("num_batches_tracked", Tensor(np.zeros(()), dtype=dtype,
                                                                label="num_batches_tracked"))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        self._dtype = np.dtype(dtype).name

    def forward(self, x: Any) -> Tensor:
        x = as_input(x, self._dtype)
        use_batch = self.training or not self.track_running_stats
        momentum: float | Tensor = 0.0 if self.momentum is None else self.momentum
        updated = self.training and self.track_running_stats
        if updated:
            count = self.num_batches_tracked + 1.0
            if self.momentum is None:  # a cumulative average
                momentum = 1.0 / count
        out = F.batch_norm(x, self.running_mean if updated or not use_batch else None,
                           self.running_var if updated or not use_batch else None, self.weight, self.bias,
                           use_batch, momentum, self.eps)
        if updated:
            self.num_batches_tracked.assign(count)  # after batch_norm checked the input
        return out

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")
