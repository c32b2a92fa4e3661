"""``mlir_nn.nn.utils``: gradient clipping, eager or inside a compiled step (PyTorch's names)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, current_trace, maximum, minimum, no_grad


def _with_grads(parameters: Any) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    trace = current_trace()
    return [p for p in params if p._grad is not None and (trace is None or p._grad._trace is trace)]


def _set_grad(p: Tensor, grad: Tensor) -> None:
    trace = current_trace()
    if trace is not None:
        trace.save_grad(p)  # the step leaves the eager .grad as it was
    p._grad = grad


def clip_grad_norm_(parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale the gradients so that their total ``norm_type`` norm is at most ``max_norm``:
    each is multiplied by min(1, max_norm / (total + 1e-6)). Returns the total norm (a tensor;
    inside ``mlir_nn.jit`` a traced one the step can return)."""
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not max_norm >= 0 or not (norm_type > 0):
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0 and norm_type > 0, got {max_norm}, {norm_type}")
    params = _with_grads(parameters)
    if not params:
        return Tensor(0.0)
    with no_grad():
        grads = [p._grad for p in params]
        if math.isinf(norm_type):
            total = grads[0].abs().max()
            for g in grads[1:]:
                total = maximum(total, g.abs().max())
        else:
            total = sum((g.abs() ** norm_type).sum() for g in grads) ** (1.0 / norm_type)
        if error_if_nonfinite and current_trace() is None and not np.isfinite(total.data):
            raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} is non-finite ({total.data})")
        scale = minimum(max_norm / (total + 1e-6), 1.0)
        for p, g in zip(params, grads):
            _set_grad(p, g * scale)
    return total


def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
    """Clamp every gradient element into [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    if not clip_value >= 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    with no_grad():
        for p in _with_grads(parameters):
            _set_grad(p, p._grad.clamp(-clip_value, clip_value))
