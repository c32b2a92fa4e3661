"""On/off settings read from environment variables ("0" or "1")."""

from __future__ import annotations

import os


def switch(name: str, default: bool, meaning: str = "") -> bool:
    """``$name`` as a switch: "1" on, "0" off, unset or empty ``default``; anything else is a
    ValueError that names the variable (and ``meaning``, what 1 does, when given)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if text not in ("0", "1"):
        what = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name} must be 0 or 1{what}, got {os.environ[name]!r}")
    return text == "1"
