"""A learning-rate schedule's saved state, checked whole against the schedule's own before
anything is written: the same names (never ``optimizer``), each value of the same kind
(bool, integer, number that is not NaN, the same string, a list of the same length), the
learning rates finite and >= 0, ``last_epoch`` >= -1, the settings in the ranges the
constructor accepts (a period of 0 divided by zero at the next ``step()``). A bad checkpoint changes nothing,
instead of failing (or dividing by zero) at a later ``step()``."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

RATES = ("base_lrs", "_last_lr", "min_lrs")  # lists of learning rates, one per group


POSITIVE, NON_NEGATIVE, FRACTION = "a number > 0", "a number >= 0", "a number in [0, 1)"
_INSIDE = {POSITIVE: lambda v: v > 0, NON_NEGATIVE: lambda v: v >= 0, FRACTION: lambda v: 0 <= v < 1}


def checked_state(
    name: str, own: Mapping[str, Any], state: Any, settings: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``state`` as values of the kinds of ``own`` (the schedule's ``state_dict()``), each of
    ``settings`` ({name: POSITIVE, NON_NEGATIVE or FRACTION}, what the constructor accepts) in
    its range; a ValueError naming ``name`` and the entry otherwise."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{name}: expected a dict of {sorted(own)}, got {type(state).__name__}")
    missing, unknown = sorted(set(own) - set(state)), sorted(map(str, set(state) - set(own)))
    if missing or unknown:
        found = [f"lacks {', '.join(missing)}"] * bool(missing) + [f"has unknown {', '.join(unknown)}"] * bool(unknown)
        raise ValueError(f"{name}: the saved schedule {' and '.join(found)}; a checkpoint of another schedule?")
    checked = {key: _like(f"{name}: {key}", own[key], state[key]) for key in own}
    for key in RATES:
        if key in checked and not all(math.isfinite(r) and r >= 0 for r in checked[key]):
            raise ValueError(f"{name}: {key} must hold finite learning rates >= 0, got {checked[key]!r}")
    for key, inside in (settings or {}).items():
        if not _INSIDE[inside](checked[key]):
            raise ValueError(f"{name}: {key} must be {inside}, got {checked[key]!r}")
    if checked.get("last_epoch", -1) < -1:
        raise ValueError(f"{name}: last_epoch must be >= -1, got {checked['last_epoch']}")
    return checked


def _like(where: str, own: Any, value: Any) -> Any:
    """``value`` if it is of ``own``'s kind (lists and tuples element by element)."""
    if isinstance(own, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(own, numbers.Integral):
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif isinstance(own, numbers.Real):
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value):
            return float(value)
    elif isinstance(own, (list, tuple)):
        if isinstance(value, (list, tuple)) and len(value) == len(own):
            return type(own)(_like(f"{where}[{i}]", o, v) for i, (o, v) in enumerate(zip(own, value)))
    elif value == own and type(value) is type(own):  # a string (a mode, a phase's key) or None
        return value
    raise ValueError(f"{where} is {value!r}; expected {_kind(own)}")


def _kind(own: Any) -> str:
    if isinstance(own, bool):
        return "True or False"
    if isinstance(own, numbers.Integral):
        return "an integer"
    if isinstance(own, numbers.Real):
        return "a number (not NaN)"
    if isinstance(own, (list, tuple)):
        return f"a list of {len(own)}"
    return repr(own)
