"""Loss functions with PyTorch's names and semantics (``mlir_nn.nn.functional`` re-exports them;
``mlir_nn.nn.loss`` has the module forms).

Every loss takes ``reduction="mean"|"sum"|"none"``. Prediction and target must have the
same shape (PyTorch broadcasts with a warning; here it is an error naming the loss).
Class labels are numbers of the logits' dtype (a traced step computes in one dtype).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, apply, current_trace, minimum
from mlir_nn.ir import ShapeError
from mlir_nn.ir.shapes import DTypeError, fmt_shape

REDUCTIONS = ("mean", "sum", "none")


def _reduced(name: str, loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")


def _check_reduction(name: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}: reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")


def _same_dtype(name: str, target: Tensor, pred: Tensor, role: str = "input", labels: str = "") -> None:
    """A target of another dtype than the prediction (a step argument: arrays become tensors of
    their own dtype) is refused in the loss's words, not by an op the user never called."""
    if target.dtype != pred.dtype:
        raise DTypeError(f"{name}: the target is {target.dtype}, the {role} {pred.dtype}; pass {labels}the target "
                         f"as {pred.dtype}")


def _pair(name: str, pred: Any, target: Any) -> tuple[Tensor, Tensor]:
    pred = pred if isinstance(pred, Tensor) else Tensor(pred)
    target = target if isinstance(target, Tensor) else Tensor(target, dtype=pred.dtype)
    _same_dtype(name, target, pred)
    if pred.shape != target.shape:
        raise ShapeError(f"{name}: input shape {fmt_shape(pred.shape)} differs from target shape "
                         f"{fmt_shape(target.shape)}; expected equal shapes")
    return pred, target


def _weighted(loss: Tensor, weight: Any) -> Tensor:
    return loss if weight is None else loss * _as_tensor(weight, loss.dtype)


def mse_loss(pred: Any, target: Any, reduction: str = "mean") -> Tensor:
    """(pred - target)^2, reduced; the mean is one fused op (``mse``)."""
    _check_reduction("mse_loss", reduction)
    if reduction == "mean":  # the op checks the shapes
        pred = pred if isinstance(pred, Tensor) else Tensor(pred)
        target = target if isinstance(target, Tensor) else Tensor(target, dtype=pred.dtype)
        _same_dtype("mse_loss", target, pred)
        return apply("mse", pred, target)
    pred, target = _pair("mse_loss", pred, target)
    d = pred - target
    return _reduced("mse_loss", d * d, reduction)


def l1_loss(pred: Any, target: Any, reduction: str = "mean") -> Tensor:
    """|pred - target|, reduced (the gradient at 0 is 0, as PyTorch)."""
    _check_reduction("l1_loss", reduction)
    pred, target = _pair("l1_loss", pred, target)
    return _reduced("l1_loss", (pred - target).abs(), reduction)


def _huber_terms(d: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """With m = min(|d|, beta): (m^2 / 2, |d| - m); quadratic below beta, linear above."""
    m = minimum(d, beta)
    return 0.5 * m * m, d - m


def _positive(name: str, what: str, value: Any, allow_zero: bool) -> float:
    value = float(value)
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}: {what} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value}")
    return value


def smooth_l1_loss(pred: Any, target: Any, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (L1 when beta is 0)."""
    _check_reduction("smooth_l1_loss", reduction)
    beta = _positive("smooth_l1_loss", "beta", beta, allow_zero=True)
    pred, target = _pair("smooth_l1_loss", pred, target)
    d = (pred - target).abs()
    if beta == 0:
        return _reduced("smooth_l1_loss", d, reduction)
    quadratic, linear = _huber_terms(d, beta)
    return _reduced("smooth_l1_loss", quadratic / beta + linear, reduction)


def huber_loss(pred: Any, target: Any, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta * (|d| - 0.5 delta)."""
    _check_reduction("huber_loss", reduction)
    delta = _positive("huber_loss", "delta", delta, allow_zero=False)
    pred, target = _pair("huber_loss", pred, target)
    quadratic, linear = _huber_terms((pred - target).abs(), delta)
    return _reduced("huber_loss", quadratic + delta * linear, reduction)


def binary_cross_entropy(pred: Any, target: Any, weight: Any = None, reduction: str = "mean") -> Tensor:
    """-(y log p + (1 - y) log(1 - p)) for probabilities p, each log clamped at -100 (PyTorch's rule)."""
    _check_reduction("binary_cross_entropy", reduction)
    p, y = _pair("binary_cross_entropy", pred, target)
    if current_trace() is None and p._data is not None and np.any((p.data < 0) | (p.data > 1)):
        raise ValueError("binary_cross_entropy: input must hold probabilities in [0, 1] (for logits use "
                         "binary_cross_entropy_with_logits)")
    log_p, log_q = p.log().clamp(min=-100.0), (1 - p).log().clamp(min=-100.0)
    return _reduced("binary_cross_entropy", _weighted(-(y * log_p + (1 - y) * log_q), weight), reduction)


def binary_cross_entropy_with_logits(logits: Any, target: Any, weight: Any = None, reduction: str = "mean",
                                     pos_weight: Any = None) -> Tensor:
    """sigmoid + binary cross-entropy in one stable expression, finite for any finite logits x:
    (1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)."""
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    x, y = _pair("binary_cross_entropy_with_logits", logits, target)
    softplus = apply("softplus", -x)
    if pos_weight is not None:
        softplus = (1 + (_as_tensor(pos_weight, x.dtype) - 1) * y) * softplus
    return _reduced("binary_cross_entropy_with_logits", _weighted((1 - y) * x + softplus, weight), reduction)


def _as_tensor(value: Any, dtype: str) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(value, dtype=dtype)


def _log_prob_loss(name: str, log_probs: Tensor, target: Any, weight: Any, ignore_index: int, reduction: str,
                   label_smoothing: float, fused: Any, role: str = "input") -> Tensor:
    """The shared rule of cross_entropy and nll_loss from log-probabilities (N, C) (``role`` names
    what the user passed: logits or input)."""
    _check_reduction(name, reduction)
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if log_probs.ndim != 2:
        raise ShapeError(f"{name}: input must have shape (batch, classes), got {fmt_shape(log_probs.shape)}")
    n, classes = log_probs.shape
    target = _as_tensor(target, log_probs.dtype)
    _same_dtype(name, target, log_probs, role, "class labels as integers (np.int64) or ")
    w = None if weight is None else _as_tensor(weight, log_probs.dtype)
    if w is not None and w.shape != (classes,):
        raise ShapeError(f"{name}: weight has shape {fmt_shape(w.shape)}, expected ({classes},), one per class")
    eps = float(label_smoothing)
    if target.ndim == 2:  # class probabilities
        if target.shape != log_probs.shape:
            raise ShapeError(f"{name}: target {fmt_shape(target.shape)} does not match {role} "
                             f"{fmt_shape(log_probs.shape)}; expected labels (batch,) or probabilities "
                             "(batch, classes)")
        if fused is not None and w is None and eps == 0 and reduction == "mean":
            return -(fused * target).sum(axis=1).mean()
        smoothed = target if eps == 0 else target * (1 - eps) + eps / classes
        terms = log_probs * smoothed
        row = -(_weighted(terms, w)).sum(axis=1)
        return _reduced(name, row, reduction)
    if target.shape != (n,):
        raise ShapeError(f"{name}: labels {fmt_shape(target.shape)} do not match {role} {fmt_shape(log_probs.shape)}; "
                         "expected one label per row")
    explicit = ignore_index != -100 or (current_trace() is None and target._data is not None
                                        and np.any(target.data == ignore_index))
    if fused is not None and not explicit and w is None and eps == 0 and reduction == "mean":
        return -(fused * apply("one_hot", target, classes=int(classes))).sum(axis=1).mean()
    valid = 1.0 - apply("eq", target, float(ignore_index))
    onehot = apply("one_hot", target * valid, classes=int(classes))
    chosen = -(_weighted(log_probs * onehot, w)).sum(axis=1)
    row = chosen if eps == 0 else (1 - eps) * chosen - eps / classes * _weighted(log_probs, w).sum(axis=1)
    row = row * valid
    if reduction != "mean":
        return _reduced(name, row, reduction)
    counted = valid if w is None else (onehot * w).sum(axis=1) * valid
    return row.sum() / counted.sum()


def cross_entropy(logits: Any, target: Any, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's ``cross_entropy`` for logits (batch, classes): -log_softmax(logits) at the label.

    ``target`` holds integer class labels (batch,) or class probabilities (batch, classes).
    ``weight`` (classes,) weighs the classes; rows labelled ``ignore_index`` count for nothing;
    ``label_smoothing`` mixes the target with the uniform distribution. The plain mean over
    labels or probabilities is the form the optimizer fuses into one gradient kernel. Inside
    a compiled step the default ``ignore_index`` (-100) is not looked for (the labels are
    unknown while tracing): pass it explicitly to mask rows there.
    """
    logits = logits if isinstance(logits, Tensor) else Tensor(logits)
    if logits.ndim != 2:
        raise ShapeError(f"cross_entropy: logits must have shape (batch, classes), got {fmt_shape(logits.shape)}")
    log_probs = logits.log_softmax(axis=1)
    return _log_prob_loss("cross_entropy", log_probs, target, weight, ignore_index, reduction, label_smoothing,
                          fused=log_probs, role="logits")


def nll_loss(log_probs: Any, target: Any, weight: Any = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """-log_probs at the label (labels (batch,) for log-probabilities (batch, classes)), as PyTorch."""
    log_probs = log_probs if isinstance(log_probs, Tensor) else Tensor(log_probs)
    target = _as_tensor(target, log_probs.dtype)
    if target.ndim != 1:
        raise ShapeError(f"nll_loss: target must be class labels (batch,), got {fmt_shape(target.shape)}")
    return _log_prob_loss("nll_loss", log_probs, target, weight, ignore_index, reduction, 0.0, fused=None)
