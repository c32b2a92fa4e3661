"""Optimizers with PyTorch's update rules, written in tensor ops.

``step`` uses ``Tensor.assign``: eagerly it writes the new values in place; inside
``mlir_nn.jit`` it becomes parameter updates of the traced step. State (momentum
buffers, Adam moments, bias-correction powers) are tensors too, so they live in the
compiled step as parameters.

Hyperparameters (``lr``, ``momentum``, ``weight_decay``, ``betas``, ``eps``) are checked
whenever they are set and are run-time inputs of a compiled step: a traced update reads
them through 0-d ``FedTensor``s that the step refreshes on every call, so ``opt.lr = x``
(or a schedule) takes effect on the next call without recompiling. Whether momentum and
weight decay are zero is structural (``structure_key``): switching one between zero and
nonzero re-traces, since a zero one adds no ops (and no momentum buffer) to the step.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, current_trace, state_array
from mlir_nn.jit.feeds import FedTensor
from mlir_nn.jit.guards import TrackedDict, structure_changed
from mlir_nn.runtime import residency


def real(owner: str, name: str, value: Any) -> float:
    """``value`` as a finite float; a clear TypeError or ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{owner}: {name} must be finite, got {number}")
    return number


def non_negative(owner: str, name: str, value: Any) -> float:
    number = real(owner, name, value)
    if number < 0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {number}")
    return number


def betas_pair(owner: str, name: str, value: Any) -> tuple[float, float]:
    """Two coefficients, each in [0, 1)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"{owner}: {name} must be a pair (beta1, beta2), got {value!r}")
    pair = (real(owner, f"{name}[0]", value[0]), real(owner, f"{name}[1]", value[1]))
    if not all(0 <= b < 1 for b in pair):
        raise ValueError(f"{owner}: {name} must be in [0, 1), got {pair}")
    return pair


class Hyperparameter:
    """An optimizer attribute validated by ``check`` on every assignment."""

    def __init__(self, check: Callable[[str, str, Any], Any]) -> None:
        self.check = check

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        return self if obj is None else obj.__dict__[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        old = obj.__dict__.get(self.name)
        new = obj.__dict__[self.name] = self.check(type(obj).__name__, self.name, value)
        if not isinstance(new, float) or not isinstance(old, float) or (old == 0) != (new == 0):
            structure_changed()  # a term of the update may switch on or off (Optimizer._terms)


class Optimizer:
    HYPERPARAMETERS: tuple[str, ...] = ("lr",)  # what state_dict saves in its param group
    STATE: dict[str, str] = {}  # a parameter's state: name -> "param" (its shape) or "scalar"

    lr = Hyperparameter(non_negative)

    def __init__(self, params: list[Tensor], lr: float) -> None:
        self.parameters = list(params)
        if not self.parameters:
            raise ValueError(f"{type(self).__name__}: optimizer got an empty parameter list (are the model's "
                             "parameters registered? assign nn.Parameter or nn.Module attributes)")
        for i, p in enumerate(self.parameters):
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameter {i} must be a Tensor, got {type(p).__name__}")
        self.lr = lr
        self.state: dict[int, dict[str, Tensor]] = TrackedDict()
        self._fed: dict[tuple[str, str], FedTensor] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        """Set the attribute and report a possible change of structure (hyperparameters report
        only when one switches between zero and nonzero)."""
        object.__setattr__(self, name, value)
        if not isinstance(getattr(type(self), name, None), Hyperparameter):
            structure_changed()

    def structure_tracked(self) -> bool:
        """True when every change of ``structure_key()`` is reported to ``mlir_nn.jit.guards`` (the
        optimizers defined here; a subclass with its own key or terms says False)."""
        cls = type(self)
        return (cls.structure_key is Optimizer.structure_key and cls._terms in _TRACKED_TERMS
                and isinstance(self.state, TrackedDict)
                and all(isinstance(slot, TrackedDict) for slot in self.state.values()))

    def zero_grad(self) -> None:
        for p in self.parameters:
            p.grad = 0

    def _state(self, p: Tensor, name: str, init: float = 0.0, shape: tuple | None = None) -> Tensor:
        slot = self.state.setdefault(id(p), TrackedDict())
        if name not in slot:
            slot[name] = Tensor(np.full(p.shape if shape is None else shape, init), dtype=p.dtype,
                                label=f"{p.label}.{name}")
        return slot[name]

    def _hyper(self, name: str, dtype: str, source: Callable[[], float] | None = None) -> float | Tensor:
        """A hyperparameter in an update of a ``dtype`` parameter: its value when eager; while
        tracing, a 0-d tensor that a compiled step refreshes from the attribute on every call."""
        read = source or functools.partial(self.__dict__.__getitem__, name)  # the validated value
        if current_trace() is None:
            return read()
        key = (name, dtype)
        if key not in self._fed:
            self._fed[key] = FedTensor(read, dtype, label=f"{type(self).__name__}.{name}")
        return self._fed[key]

    def structure_key(self) -> tuple:
        """What a traced step of this optimizer depends on besides hyperparameter values: the
        class, the parameter and state tensors, and which optional terms are on."""
        state = [id(t) for slot in self.state.values() for t in slot.values()] if self.state else ()
        return type(self), tuple(map(id, self.parameters)), tuple(state), self._terms()

    def _terms(self) -> tuple[bool, ...]:
        return ()

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's shape: {"state": {param index: {name: array}}, "param_groups": [{hyper..., "params": [...]}]}."""
        index = {id(p): i for i, p in enumerate(self.parameters)}
        residency.fetch([t.data for slot in self.state.values() for t in slot.values()])
        state = {index[key]: {name: t.data.copy() for name, t in slot.items()}
                 for key, slot in self.state.items() if key in index}
        group = {name: getattr(self, name) for name in self.HYPERPARAMETERS}
        return {"state": state, "param_groups": [group | {"params": list(range(len(self.parameters)))}]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore hyperparameters and state (in place where it exists, so compiled steps see it).
        Everything is checked before anything is written: a bad checkpoint changes nothing."""
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"state", "param_groups"}:
            found = sorted(map(str, state_dict)) if isinstance(state_dict, Mapping) else type(state_dict).__name__
            raise ValueError(f"{name}: expected {{'state': {{...}}, 'param_groups': [one group]}}, got {found}")
        groups, states = state_dict["param_groups"], state_dict["state"]
        if not isinstance(groups, (list, tuple)) or len(groups) != 1 or not isinstance(groups[0], Mapping) \
                or not isinstance(states, Mapping):
            raise ValueError(f"{name}: expected {{'state': {{...}}, 'param_groups': [one group]}}")
        group = groups[0]
        unknown = sorted(set(map(str, group)) - {*self.HYPERPARAMETERS, "params"})
        if unknown:
            raise ValueError(f"{name}: the saved group has {', '.join(unknown)}, which {type(self).__name__} does not "
                             f"have (its hyperparameters: {', '.join(self.HYPERPARAMETERS)}); a checkpoint of another "
                             "optimizer?")
        params = group.get("params", ())
        if not isinstance(params, (list, tuple)) or list(params) != list(range(len(self.parameters))):
            raise ValueError(f"{name}: the saved group has params {params!r}, this optimizer has "
                             f"{len(self.parameters)} parameters")
        hyper = {}
        for key in self.HYPERPARAMETERS:
            if key in group:
                value = tuple(group[key]) if isinstance(group[key], list) else group[key]
                hyper[key] = getattr(type(self), key).check(type(self).__name__, key, value)
        arrays = {(int(i), key): value for i, slot in states.items()
                  for key, value in self._checked_slot(name, i, slot)}
        for key, value in hyper.items():  # nothing below can fail
            setattr(self, key, value)
        for (i, key), value in arrays.items():
            p = self.parameters[i]
            slot = self.state.setdefault(id(p), TrackedDict())
            if key in slot:
                slot[key].data[...] = value
                residency.written([slot[key].data])  # device copies are stale now
            else:
                slot[key] = Tensor(value, dtype=p.dtype, label=f"{p.label}.{key}")

    def _checked_slot(self, name: str, index: Any, slot: Any) -> list[tuple[str, np.ndarray]]:
        """The state of parameter ``index`` as (name, array) pairs, each checked against STATE."""
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not 0 <= index < len(self.parameters):
            raise ValueError(f"{name}: state for parameter {index!r}; expected indices 0 to {len(self.parameters) - 1}")
        if not isinstance(slot, Mapping) or set(slot) != set(self.STATE):
            found = sorted(map(str, slot)) if isinstance(slot, Mapping) else type(slot).__name__
            raise ValueError(f"{name}: state of parameter {index} has {found}, expected {sorted(self.STATE)}")
        p = self.parameters[int(index)]
        return [(key, state_array(value, f"{name}: state {key} of parameter {index}", p.dtype,
                                  p.shape if self.STATE[key] == "param" else ()))
                for key, value in slot.items()]

    def step(self) -> None:
        for p in self.parameters:
            if p._grad is not None:
                self._update(p, p._grad)

    def _update(self, p: Tensor, grad: Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """p -= lr * (momentum buffer of (grad + weight_decay * p))."""

    HYPERPARAMETERS = ("lr", "momentum", "weight_decay")
    STATE = {"momentum_buffer": "param"}

    momentum = Hyperparameter(non_negative)
    weight_decay = Hyperparameter(non_negative)

    def __init__(self, params: list[Tensor], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.momentum, self.weight_decay = momentum, weight_decay

    def _terms(self) -> tuple[bool, ...]:
        values = self.__dict__  # what the Hyperparameter descriptors hold, read without them
        return values["momentum"] != 0, values["weight_decay"] != 0

    def _update(self, p: Tensor, grad: Tensor) -> None:
        if self.weight_decay:
            grad = grad + self._hyper("weight_decay", p.dtype) * p
        if self.momentum:
            # The buffer starts at zero, so the first step sets it to grad, as PyTorch does.
            buf = self._state(p, "momentum_buffer")
            new_buf = self._hyper("momentum", p.dtype) * buf + grad
            buf.assign(new_buf)
            grad = new_buf
        p.assign(p - self._hyper("lr", p.dtype) * grad)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with PyTorch's bias correction and L2 weight_decay."""

    HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")
    STATE = {"exp_avg": "param", "exp_avg_sq": "param", "beta1_power": "scalar", "beta2_power": "scalar"}

    betas = Hyperparameter(betas_pair)
    eps = Hyperparameter(non_negative)
    weight_decay = Hyperparameter(non_negative)

    def __init__(self, params: list[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def _terms(self) -> tuple[bool, ...]:
        return (self.__dict__["weight_decay"] != 0,)

    def _update(self, p: Tensor, grad: Tensor) -> None:
        b1 = self._hyper("beta1", p.dtype, lambda: self.betas[0])
        b2 = self._hyper("beta2", p.dtype, lambda: self.betas[1])
        if self.weight_decay:
            grad = grad + self._hyper("weight_decay", p.dtype) * p
        m, v = self._state(p, "exp_avg"), self._state(p, "exp_avg_sq")
        b1_pow, b2_pow = self._state(p, "beta1_power", 1.0, ()), self._state(p, "beta2_power", 1.0, ())
        new_b1_pow, new_b2_pow = b1_pow * b1, b2_pow * b2
        new_m = b1 * m + (1 - b1) * grad
        new_v = b2 * v + (1 - b2) * (grad * grad)
        m_hat = new_m / (1 - new_b1_pow)
        v_hat = new_v / (1 - new_b2_pow)
        p.assign(p - self._hyper("lr", p.dtype) * m_hat / (v_hat.sqrt() + self._hyper("eps", p.dtype)))
        for state, value in ((m, new_m), (v, new_v), (b1_pow, new_b1_pow), (b2_pow, new_b2_pow)):
            state.assign(value)


_TRACKED_TERMS = (Optimizer._terms, SGD._terms, Adam._terms)  # terms that read zero-ness of hyperparameters
