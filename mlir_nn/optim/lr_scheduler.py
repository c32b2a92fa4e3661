"""Learning-rate schedules with PyTorch's names and semantics (``mlir_nn.optim`` exports them).

A schedule sets the learning rate of every parameter group (from the group's
``initial_lr``): constructing it applies epoch 0, each ``step()`` the next epoch.
``get_last_lr()`` is the list PyTorch returns (one rate per group). The learning rate is a
run-time input of a compiled step, so the next call uses the new value without recompiling.
``OneCycleLR`` also cycles the momentum (SGD's ``momentum``, Adam's ``betas[0]``);
``ReduceLROnPlateau`` is stepped with the metric it watches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mlir_nn.optim.scheduler_state import FRACTION, NON_NEGATIVE, POSITIVE, checked_state

if TYPE_CHECKING:
    from mlir_nn.optim.optimizers import Optimizer


class LRScheduler:
    """Base class: ``lr_at(epoch, base_lr)`` gives a group's learning rate of an epoch from its ``initial_lr``."""

    SETTINGS: dict[str, str] = {}  # the ranges of the settings a loaded state must respect

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"{type(self).__name__}: resuming at last_epoch={last_epoch} needs 'initial_lr' in "
                               "every parameter group")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, epoch: int, base_lr: float) -> float:
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch and set every group's learning rate."""
        self.last_epoch += 1
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(self.last_epoch, base_lr)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer (and functions, which are code)."""
        return {k: v for k, v in vars(self).items() if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``, checked whole first (``scheduler_state``)."""
        name = f"{type(self).__name__}.load_state_dict"
        self.__dict__.update(checked_state(name, self.state_dict(), state, self.SETTINGS))



class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    SETTINGS = {"step_size": POSITIVE}

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if not isinstance(step_size, int) or step_size < 1:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size!r}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.gamma ** (epoch // self.step_size)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    SETTINGS = {"T_max": POSITIVE}

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be positive, got {T_max!r}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float], last_epoch: int = -1) -> None:
        if not callable(lr_lambda):
            raise TypeError(f"LambdaLR: lr_lambda must be callable, got {type(lr_lambda).__name__}")
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int, base_lr: float) -> float:
        return base_lr * self.lr_lambda(epoch)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin), as PyTorch's: the rate rises from max_lr / div_factor to
    max_lr over the first ``pct_start`` of ``total_steps`` and anneals to
    initial_lr / final_div_factor (``three_phase``: back down to the initial rate first), while
    the momentum moves the opposite way between max_momentum and base_momentum. Step it after
    every batch."""

    SETTINGS = {"total_steps": POSITIVE}

    def __init__(self, optimizer: Optimizer, max_lr: float | list[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True, base_momentum: float = 0.85,
                 max_momentum: float = 0.95, div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False, last_epoch: int = -1) -> None:
        name = "OneCycleLR"
        if total_steps is None:
            counts = (epochs, steps_per_epoch)
            if not all(isinstance(c, int) and c > 0 for c in counts):
                raise ValueError(f"{name}: give total_steps, or epochs and steps_per_epoch (positive integers)")
            total_steps = int(epochs) * int(steps_per_epoch)  # type: ignore[arg-type]
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"{name}: total_steps must be a positive integer, got {total_steps!r}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"{name}: pct_start must be in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{name}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        groups = optimizer.param_groups
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * len(groups)
        if len(max_lrs) != len(groups):
            raise ValueError(f"{name}: expected {len(groups)} max_lr values, got {len(max_lrs)}")
        self.total_steps, self.cycle_momentum = total_steps, cycle_momentum
        self._anneal = _cos_anneal if anneal_strategy == "cos" else _linear_anneal
        end = float(pct_start * total_steps)
        self._phases = ([(end - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                         (2 * end - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                         (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")] if three_phase else
                        [(end - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                         (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")])
        if cycle_momentum and not all("momentum" in g or "betas" in g for g in groups):
            raise ValueError(f"{name}: cycle_momentum needs an optimizer with momentum or betas")
        if last_epoch == -1:
            for group, top in zip(groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
                if cycle_momentum:
                    group["max_momentum"], group["base_momentum"] = max_momentum, base_momentum
                    self._set_momentum(group, max_momentum)
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _set_momentum(group: Any, value: float) -> None:
        if "betas" in group:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def step(self) -> None:
        self.last_epoch += 1
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times, more than total_steps={self.total_steps}")
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
                if step <= end or i == len(self._phases) - 1:
                    pct = (step - start) / (end - start)
                    group["lr"] = self._anneal(group[lr0], group[lr1], pct)
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[m0], group[m1], pct))
                    break
                start = end
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def _cos_anneal(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _linear_anneal(start: float, end: float, pct: float) -> float:
    return (end - start) * pct + start


class ReduceLROnPlateau:
    """Multiply the learning rates by ``factor`` when a metric has stopped improving for
    ``patience`` epochs, as PyTorch's: ``step(metric)`` once per epoch. Improvement is
    relative (``threshold_mode="rel"``) or absolute, in ``mode`` "min" or "max"; after a
    reduction, ``cooldown`` epochs pass before counting again; rates stop at ``min_lr`` and
    changes smaller than ``eps`` are skipped."""

    SETTINGS = {"factor": FRACTION, "patience": NON_NEGATIVE, "cooldown": NON_NEGATIVE, "eps": NON_NEGATIVE,
                "threshold": NON_NEGATIVE}

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | list[float] = 0.0, eps: float = 1e-8) -> None:
        name = "ReduceLROnPlateau"
        if not 0 <= factor < 1:
            raise ValueError(f"{name}: factor must be in [0, 1), got {factor!r}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"{name}: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', got "
                             f"{mode!r}, {threshold_mode!r}")
        groups = optimizer.param_groups
        self.min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * len(groups)
        if len(self.min_lrs) != len(groups):
            raise ValueError(f"{name}: expected {len(groups)} min_lr values, got {len(self.min_lrs)}")
        self.optimizer = optimizer
        self.mode, self.factor, self.patience, self.threshold = mode, factor, patience, threshold
        self.threshold_mode, self.cooldown, self.eps = threshold_mode, cooldown, eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs, self.cooldown_counter, self.last_epoch = 0, 0, 0
        self._last_lr = [group["lr"] for group in groups]

    def _better(self, value: float) -> bool:
        if self.mode == "min":
            edge = self.best * (1 - self.threshold) if self.threshold_mode == "rel" else self.best - self.threshold
            return value < edge
        edge = self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        return value > edge

    def step(self, metrics: Any) -> None:
        """Record one epoch's metric (a number, or a one-element tensor read eagerly)."""
        value = float(metrics)
        self.last_epoch += 1
        if self._better(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lrs):
                new = max(group["lr"] * self.factor, floor)
                if group["lr"] - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``, checked whole first (``scheduler_state``)."""
        name = f"{type(self).__name__}.load_state_dict"
        self.__dict__.update(checked_state(name, self.state_dict(), state, self.SETTINGS))
