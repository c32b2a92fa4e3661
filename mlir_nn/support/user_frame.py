"""Where the user's code is: the innermost stack frame outside this package (and outside
the libraries it calls on the user's behalf), for errors that must name the user's line."""

from __future__ import annotations

import linecache
import os
import random
import sys
from types import FrameType

import numpy as np

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARIES = (_PACKAGE, os.path.dirname(os.path.abspath(np.__file__)) + os.sep,
              os.path.dirname(os.path.abspath(random.__file__)) + os.sep)  # Python's own library


def is_library(filename: str) -> bool:
    """True for a file of this package, NumPy or Python's standard library (and code they generate,
    named like ``<string>``; the interactive ``<stdin>`` is the user's)."""
    if filename.startswith("<"):
        return filename != "<stdin>"
    path = os.path.abspath(filename)
    return any(path.startswith(prefix) for prefix in _LIBRARIES)


def user_frame(frame: FrameType | None = None) -> FrameType | None:
    """The innermost frame at or above ``frame`` (default: the caller's) outside the libraries."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None and is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def in_package(filename: str) -> bool:
    """True for a file of this package."""
    return os.path.abspath(filename).startswith(_PACKAGE)


def describe(frame: FrameType | None) -> str:
    """'file:line in function: source line' for ``frame`` ('<unknown location>' for None)."""
    if frame is None:
        return "<unknown location>"
    code = frame.f_code
    source = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}" + (f": {source}" if source else "")
