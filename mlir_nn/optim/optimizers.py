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

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from mlir_nn.engine import Tensor, current_trace, enable_grad, no_grad, state_array
from mlir_nn.jit.feeds import FedTensor
from mlir_nn.jit.guards import TrackedDict, TrackedList, structure_changed
from mlir_nn.runtime import residency
from mlir_nn.support import pages
from mlir_nn.support.domains import COUNT, NON_NEGATIVE, check_domain


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


def flag(owner: str, name: str, value: Any) -> bool:
    """A Python bool (a structural switch: changing it re-traces a compiled step)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def betas_pair(owner: str, name: str, value: Any) -> tuple[float, float]:
    """Two coefficients, each in [0, 1)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"{owner}: {name} must be a pair (beta1, beta2), got {value!r}")
    pair = (real(owner, f"{name}[0]", value[0]), real(owner, f"{name}[1]", value[1]))
    if not all(0 <= b < 1 for b in pair):
        raise ValueError(f"{owner}: {name} must be in [0, 1), got {pair}")
    return pair


class Hyperparameter:
    """An optimizer attribute that reads the first parameter group's value and sets every
    group's (``opt.lr = x``); ``check`` validates the value wherever it is set."""

    def __init__(self, check: Callable[[str, str, Any], Any]) -> None:
        self.check = check

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        groups = obj.__dict__.get("param_groups")
        return groups[0][self.name] if groups else obj.__dict__["_defaults"][self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        groups = obj.__dict__.get("param_groups")
        if not groups:
            obj.__dict__.setdefault("_defaults", {})[self.name] = self.check(type(obj).__name__, self.name, value)
            return
        for group in groups:
            group[self.name] = value


def _structure_of(value: Any) -> Any:
    """What a hyperparameter value contributes to a traced step's structure: whether a number is
    zero (a zero term adds no ops), the value itself for anything else (flags such as nesterov)."""
    if isinstance(value, float):
        return value == 0
    if isinstance(value, tuple):
        return tuple(map(_structure_of, value))
    return value


SCHEDULE_KEYS = ("initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum")  # what schedules add


def _numeric(value: Any) -> bool:
    """A float or a tuple of floats (fed to compiled steps; never structure by its value)."""
    return isinstance(value, float) or (isinstance(value, tuple) and all(isinstance(v, float) for v in value))


class ParamGroup(dict):
    """One parameter group: ``"params"`` and hyperparameters. Every assignment is validated
    (``opt.param_groups[0]["lr"] = x`` as ``opt.lr = x``) and reports a change of structure
    when it may add or remove ops from a traced step (a value switching to or from zero)."""

    def __init__(self, owner: Optimizer, values: Mapping[str, Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_owner", owner)
        for key, value in values.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        owner = self._owner
        name = type(owner).__name__
        if key == "params":
            value = TrackedList(_checked_params(name, value))
        else:
            check = getattr(type(owner), key, None)
            if isinstance(check, Hyperparameter):
                value = check.check(name, key, value)
            elif isinstance(value, numbers.Real) and not isinstance(value, bool):
                value = real(name, key, value)
        old = self.get(key)
        super().__setitem__(key, value)
        if key == "params" or _structure_of(old) != _structure_of(value) or type(old) is not type(value):
            structure_changed()


def _checked_params(owner: str, params: Any) -> list[Tensor]:
    params = [params] if isinstance(params, Tensor) else list(params)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"{owner}: parameter {i} must be a Tensor, got {type(p).__name__}")
    return params


class GroupHyperparameters(Mapping):
    """What ``Optimizer.update`` sees of its parameter group: hyperparameters by name, numbers as
    floats eagerly and, while tracing, as 0-d tensors a compiled step refreshes on every call (so
    ``opt.param_groups[i]["lr"] = x`` takes effect without recompiling). Flags (bools) and other
    values are given as they are: they are structure, and changing them re-traces."""

    def __init__(self, optimizer: Optimizer, index: int, dtype: str) -> None:
        self._optimizer, self._index, self._dtype = optimizer, index, dtype
        self._group = optimizer.param_groups[index]

    def __getitem__(self, name: str) -> Any:
        value = self._group[name]
        if isinstance(value, float):
            return self._optimizer._fed_value(self._index, name, self._dtype, lambda: self._group[name])
        if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
            return tuple(self._optimizer._fed_value(self._index, f"{name}[{i}]", self._dtype,
                                                    lambda i=i: self._group[name][i]) for i in range(len(value)))
        return value

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._group if key != "params")

    def __len__(self) -> int:
        return len(self._group) - 1

    def nonzero(self, name: str) -> bool:
        """Whether a numeric hyperparameter is nonzero: a Python decision an update may take (a zero
        term adds no ops). Asking makes it structure: switching it between zero and nonzero
        re-traces a compiled step (other values, such as a learning rate reaching 0, do not)."""
        self._optimizer._asked.add(name)
        return bool(np.any(np.asarray(self._group[name]) != 0))


class Optimizer:
    """Base class: parameter groups, per-parameter state, ``step()``, state dicts.

    A new optimizer is a subclass with a constructor passing its defaults and an ``update``
    method: tensor code over ``p``, its gradient ``grad``, the parameter's ``state`` (a dict
    of tensors, kept between steps) and ``group`` (its hyperparameters). ``update`` runs
    under ``no_grad``, so in-place updates are parameter updates; it runs eagerly and
    compiles inside ``mlir_nn.jit`` like the built-in optimizers::

        class SignSGD(Optimizer):
            def __init__(self, params, lr=0.01, momentum=0.9):
                super().__init__(params, dict(lr=lr, momentum=momentum))

            def update(self, p, grad, state, group):
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = zeros_like(p)
                buf = state["momentum_buffer"]
                buf *= group["momentum"]
                buf += grad
                p -= group["lr"] * buf.sign()

    ``params`` is a list of tensors or of parameter groups (dicts with ``"params"`` and
    hyperparameters that override the defaults), as in PyTorch.
    """

    HYPERPARAMETERS: tuple[str, ...] = ("lr",)  # what state_dict saves in its param group, in order
    STATE: dict[str, str] = {}  # a parameter's state names -> "param" (its shape) or "scalar"; {}: any
    STATE_DOMAINS: dict[str, str] = {"step": COUNT}  # state names -> the values a loaded one may hold

    lr = Hyperparameter(non_negative)

    def __init__(self, params: Any, defaults: Mapping[str, Any] | float) -> None:
        if not isinstance(defaults, Mapping):  # the old form: Optimizer.__init__(self, params, lr)
            defaults = {"lr": defaults}
        defaults = {**self.__dict__.pop("_defaults", {}), **defaults}
        groups = [params] if isinstance(params, Mapping) else list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__}: optimizer got an empty parameter list (are the model's "
                             "parameters registered? assign nn.Parameter or nn.Module attributes)")
        if not isinstance(groups[0], Mapping):
            groups = [{"params": groups}]
        self._defaults = dict(defaults)
        self._asked: set[str] = set()  # hyperparameters whose zero-ness an update decided on
        self.state: dict[int, dict[str, Tensor]] = TrackedDict()
        self._fed: dict[tuple[int, str, str], FedTensor] = {}
        self.param_groups: list[ParamGroup] = TrackedList()
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: Mapping[str, Any]) -> None:
        """Add a group (``{"params": [...], hyperparameter: value, ...}``); unset ones take the defaults."""
        name = type(self).__name__
        if not isinstance(group, Mapping) or "params" not in group:
            raise TypeError(f"{name}: a parameter group must be a dict with 'params', got {type(group).__name__}")
        params = _checked_params(name, group["params"])
        if not params:
            raise ValueError(f"{name}: a parameter group has an empty parameter list")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params) or len({id(p) for p in params}) != len(params):
            raise ValueError(f"{name}: a parameter appears in more than one group (or twice in one)")
        self.param_groups.append(ParamGroup(self, {**self._defaults, **group, "params": params}))

    @property
    def parameters(self) -> list[Tensor]:
        """Every parameter, group by group."""
        return [p for group in self.param_groups for p in group["params"]]

    def __setattr__(self, name: str, value: Any) -> None:
        """Set the attribute and report a possible change of structure (hyperparameters report
        through their groups)."""
        object.__setattr__(self, name, value)
        if not isinstance(getattr(type(self), name, None), Hyperparameter):
            structure_changed()

    def structure_tracked(self) -> bool:
        """True when every change of ``structure_key()`` is reported to ``mlir_nn.jit.guards`` (the
        optimizers defined here; a subclass with its own key or terms says False)."""
        cls = type(self)
        return (cls.structure_key is Optimizer.structure_key and cls._terms is Optimizer._terms
                and isinstance(self.state, TrackedDict) and isinstance(self.param_groups, TrackedList)
                and all(isinstance(g, ParamGroup) and isinstance(g["params"], TrackedList) for g in self.param_groups)
                and all(isinstance(slot, TrackedDict) for slot in self.state.values()))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters:
            p.grad = 0

    def _state(self, p: Tensor, name: str, init: float = 0.0, shape: tuple | None = None) -> Tensor:
        slot = self.state.setdefault(id(p), TrackedDict())
        if name not in slot:
            slot[name] = Tensor(np.full(p.shape if shape is None else shape, init), dtype=p.dtype,
                                label=f"{p.label}.{name}")
        return slot[name]

    def _fed_value(self, index: int, name: str, dtype: str, read: Callable[[], float]) -> float | Tensor:
        """A hyperparameter's value when eager; while tracing, a 0-d tensor a compiled step refreshes."""
        if current_trace() is None:
            return read()
        key = (index, name, dtype)
        if key not in self._fed:
            self._fed[key] = FedTensor(read, dtype, label=f"{type(self).__name__}.{name}")
        return self._fed[key]

    def _hyper(self, name: str, dtype: str, source: Callable[[], float] | None = None) -> float | Tensor:
        """A hyperparameter of the group being stepped, in an update of a ``dtype`` parameter."""
        index = self._group_index
        group = self.param_groups[index]
        return self._fed_value(index, name, dtype, source or (lambda: group[name]))

    def structure_key(self) -> tuple:
        """What a traced step of this optimizer depends on besides hyperparameter values: the
        class, the parameter and state tensors, and which optional terms are on."""
        state = [id(t) for slot in self.state.values() for t in slot.values()] if self.state else ()
        params = tuple(tuple(map(id, g["params"])) for g in self.param_groups)
        return type(self), params, tuple(state), self._terms()

    def _terms(self) -> tuple:
        """Per group: whether each hyperparameter an update asked about (``nonzero``) is zero, and
        the values of the non-numeric ones (flags such as nesterov)."""
        asked = sorted(self._asked)
        return tuple(tuple((k, _structure_of(g[k])) for k in asked if k in g)
                     + tuple((k, v) for k, v in g.items() if k != "params" and not _numeric(v))
                     for g in self.param_groups)

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's shape: {"state": {param index: {name: array}}, "param_groups": [{hyper..., "params": [...]}]}."""
        index = {id(p): i for i, p in enumerate(self.parameters)}
        residency.fetch([t.data for slot in self.state.values() for t in slot.values()])
        state = {index[key]: {name: t.data.copy() for name, t in slot.items()}
                 for key, slot in self.state.items() if key in index}
        groups, start = [], 0
        for group in self.param_groups:
            saved = {name: group[name] for name in self.HYPERPARAMETERS if name in group}
            saved |= {k: v for k, v in group.items() if k not in saved and k != "params"}
            groups.append(saved | {"params": list(range(start, start + len(group["params"])))})
            start += len(group["params"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore hyperparameters and state (in place where it exists, so compiled steps see it).
        Everything is checked before anything is written: a bad checkpoint changes nothing."""
        name, cls = f"{type(self).__name__}.load_state_dict", type(self).__name__
        shape = f"{{'state': {{...}}, 'param_groups': [{len(self.param_groups)} group(s)]}}"
        if not isinstance(state_dict, Mapping) or set(state_dict) != {"state", "param_groups"}:
            found = sorted(map(str, state_dict)) if isinstance(state_dict, Mapping) else type(state_dict).__name__
            raise ValueError(f"{name}: expected {shape}, got {found}")
        groups, states = state_dict["param_groups"], state_dict["state"]
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups) \
                or not all(isinstance(g, Mapping) for g in groups) or not isinstance(states, Mapping):
            raise ValueError(f"{name}: expected {shape}")
        checked, start = [], 0
        for saved, group in zip(groups, self.param_groups):
            unknown = sorted(set(map(str, saved)) - {*self.HYPERPARAMETERS, "params", *group, *SCHEDULE_KEYS})
            if unknown:
                raise ValueError(f"{name}: the saved group has {', '.join(unknown)}, which {cls} does not have (its "
                                 f"hyperparameters: {', '.join(self.HYPERPARAMETERS)}); a checkpoint of another "
                                 "optimizer?")
            params, expected = saved.get("params", ()), list(range(start, start + len(group["params"])))
            if not isinstance(params, (list, tuple)) or list(params) != expected:
                raise ValueError(f"{name}: the saved group has params {params!r}, this optimizer's group has "
                                 f"{len(group['params'])} parameters {expected}")
            start += len(group["params"])
            values = {}
            for key, value in saved.items():
                if key != "params":
                    value = tuple(value) if isinstance(value, list) else value
                    check = getattr(type(self), key, None)
                    values[key] = (check.check(cls, key, value) if isinstance(check, Hyperparameter) else
                                   non_negative(cls, key, value) if key in SCHEDULE_KEYS else  # rates, momenta
                                   real(cls, key, value) if isinstance(value, numbers.Real)
                                   and not isinstance(value, bool) else value)
            checked.append(values)
        arrays = {(int(i), key): value for i, slot in states.items()
                  for key, value in self._checked_slot(name, i, slot)}
        for values, group in zip(checked, self.param_groups):  # nothing below can fail
            for key, value in values.items():
                group[key] = value
        params = self.parameters
        for (i, key), value in arrays.items():
            p = params[i]
            slot = self.state.setdefault(id(p), TrackedDict())
            if key in slot:
                slot[key].data[...] = value
                residency.written([slot[key].data])  # device copies are stale now
            else:
                slot[key] = Tensor(value, dtype=p.dtype, label=f"{p.label}.{key}")

    def _checked_slot(self, name: str, index: Any, slot: Any) -> list[tuple[str, np.ndarray]]:
        """The state of parameter ``index`` as (name, array) pairs: the names it has now (or among
        ``STATE``'s), each of its shape and finite."""
        params = self.parameters
        if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not 0 <= index < len(params):
            raise ValueError(f"{name}: state for parameter {index!r}; expected indices 0 to {len(params) - 1}")
        p = params[int(index)]
        existing = self.state.get(id(p)) or {}
        wrong = not isinstance(slot, Mapping) or (existing and set(slot) != set(existing)) \
            or (self.STATE and not set(slot) <= set(self.STATE))
        if wrong:
            found = sorted(map(str, slot)) if isinstance(slot, Mapping) else type(slot).__name__
            expected = sorted(existing) if existing else f"names among {sorted(self.STATE)}"
            raise ValueError(f"{name}: state of parameter {index} has {found}, expected {expected}")

        def shape_of(key: str, value: Any) -> tuple:
            if key in self.STATE:
                return p.shape if self.STATE[key] == "param" else ()
            if key in existing:
                return existing[key].shape
            return np.shape(value) if np.shape(value) in (p.shape, ()) else p.shape

        checked = []
        for key, value in slot.items():
            what = f"{name}: state {key} of parameter {index}"
            array = state_array(value, what, p.dtype, shape_of(key, value))
            if key in self.STATE_DOMAINS:
                check_domain(array, self.STATE_DOMAINS[key], what)
            checked.append((key, array))
        return checked

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; ``closure`` (re-evaluating the loss)
        is called first, as in PyTorch, and its result returned."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for index, group in enumerate(self.param_groups):
                self._group_index = index
                for p in group["params"]:
                    if p._grad is not None:
                        slot = self.state.setdefault(id(p), TrackedDict())
                        self.update(p, p._grad, slot, GroupHyperparameters(self, index, p.dtype))
        return loss

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        """Update ``p`` in place from ``grad``; ``state`` holds this parameter's tensors between steps
        and ``group`` its hyperparameters (see the class docstring). Subclasses override it (or,
        as SGD and Adam do, the older private ``_update(p, grad)``)."""
        self._update(p, grad)

    def _update(self, p: Tensor, grad: Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__}: an optimizer defines update(p, grad, state, group)")


def zeros_like(p: Tensor) -> Tensor:
    """A zero tensor of ``p``'s shape and dtype (new optimizer state), made in that dtype and not
    copied (``Tensor._owning``), a large one on small pages (``support.pages``)."""
    return Tensor._owning(pages.zeros(p.shape, p.dtype), label=f"{p.label}.state")


class SGD(Optimizer):
    """PyTorch's SGD: d = grad + weight_decay * p; with momentum, buf = momentum * buf +
    (1 - dampening) * d (the first step: buf = d) and d = buf, or d + momentum * buf when
    ``nesterov``; p -= lr * d. State: ``momentum_buffer`` (and ``step`` when dampening is set,
    to tell the first step apart)."""

    HYPERPARAMETERS = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    STATE = {"momentum_buffer": "param", "step": "scalar"}

    momentum = Hyperparameter(non_negative)
    dampening = Hyperparameter(real)
    weight_decay = Hyperparameter(non_negative)
    nesterov = Hyperparameter(flag)

    def __init__(self, params: Any, lr: float = 0.01, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov momentum requires a momentum > 0 and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        if group.nonzero("weight_decay"):
            grad = grad + group["weight_decay"] * p
        if group.nonzero("momentum"):
            momentum = group["momentum"]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = zeros_like(p)
            buf = state["momentum_buffer"]
            if group.nonzero("dampening"):
                # The buffer starts at zero: the first step must take the whole gradient (step == 0).
                step = self._state(p, "step", 0.0, ())
                later = step > 0.5
                buf *= momentum
                buf += (1 - group["dampening"] * later) * grad
                step += 1.0
            else:  # from zero, the first step gives buf = grad, as PyTorch's
                buf *= momentum
                buf += grad
            grad = grad + momentum * buf if group["nesterov"] else buf
        p -= group["lr"] * grad


def bias_correction(beta: Any, step: Tensor) -> Any:
    """1 - beta ** step for a 0-d step count (beta a number or a fed 0-d tensor), as exp(step * log beta)."""
    return 1 - (step * (beta if isinstance(beta, Tensor) else Tensor(beta, dtype=step.dtype)).log()).exp()


def adam_step(p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
    """PyTorch's bias-corrected Adam step on state ``step`` (0-d), ``exp_avg``, ``exp_avg_sq``
    (shared by Adam and AdamW; the correction uses the current betas, as PyTorch's)."""
    if "step" not in state:
        state["step"] = Tensor(0.0, dtype=p.dtype, label=f"{p.label}.step")
        state["exp_avg"], state["exp_avg_sq"] = zeros_like(p), zeros_like(p)
    step, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
    lr, (b1, b2) = group["lr"], group["betas"]
    step += 1.0
    m *= b1
    m += (1 - b1) * grad
    v *= b2
    v += (1 - b2) * grad * grad
    denom = v.sqrt() / bias_correction(b2, step).sqrt() + group["eps"]
    p -= lr / bias_correction(b1, step) * m / denom


class Adam(Optimizer):
    """Adam (Kingma & Ba) with PyTorch's bias correction and L2 weight_decay. State per parameter
    (PyTorch's layout): ``step`` (0-d), ``exp_avg``, ``exp_avg_sq``."""

    HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")
    STATE = {"step": "scalar", "exp_avg": "param", "exp_avg_sq": "param"}
    STATE_DOMAINS = {"step": COUNT, "exp_avg_sq": NON_NEGATIVE}

    betas = Hyperparameter(betas_pair)
    eps = Hyperparameter(non_negative)
    weight_decay = Hyperparameter(non_negative)

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        if group.nonzero("weight_decay"):
            grad = grad + group["weight_decay"] * p
        adam_step(p, grad, state, group)
