"""Value domains of saved state that a loader checks beyond shape, dtype and finiteness:
a step count is a whole number >= 0, a running average of squares is >= 0. Loaded outside
them, a later step silently computes NaN (the square root of a negative) or divides by zero."""

from __future__ import annotations

import numpy as np

COUNT = "count"  # a whole number >= 0
NON_NEGATIVE = "non_negative"  # every entry >= 0

_MEANING = {COUNT: "a whole number >= 0 (a count)", NON_NEGATIVE: "numbers >= 0"}


def check_domain(value: np.ndarray, domain: str, what: str) -> None:
    """Raise ValueError naming ``what`` unless every entry of ``value`` lies in ``domain``."""
    inside = value >= 0
    if domain == COUNT:
        inside &= value == np.round(value)
    if not np.all(inside):
        bad = value[~inside] if value.ndim else value
        raise ValueError(f"{what} must hold {_MEANING[domain]}; it has {np.ravel(bad)[0].item()!r}")
