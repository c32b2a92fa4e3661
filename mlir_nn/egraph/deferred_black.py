"""egglog without importing black until it formats something.

egglog's pretty printer imports black (the code formatter) when egglog is imported and makes
one ``black.Mode`` there, only to format the programs it prints: black's import (with click,
pathspec and its grammar) took 0.14 s of each process that optimizes a step, which prints
nothing. ``black_deferred()`` imports egglog with a stand-in for black in ``sys.modules``:
its ``Mode`` records the settings, and the first use of anything else (``format_str``,
``parsing``) imports black itself and hands over. The stand-in leaves ``sys.modules`` when
the block ends, so any later ``import black`` gets black.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

NAME = "black"


class _Mode:
    """``black.Mode``'s arguments, until black formats with them."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings


def _black() -> types.ModuleType:
    """black itself, imported now if the stand-in is still in its place."""
    if isinstance(sys.modules.get(NAME), _StandIn):
        del sys.modules[NAME]
    return importlib.import_module(NAME)


def _format_str(source: str, *, mode: Any) -> str:
    black = _black()
    return black.format_str(source, mode=black.Mode(**mode.settings) if isinstance(mode, _Mode) else mode)


class _StandIn(types.ModuleType):
    """black as egglog's pretty printer uses it: ``Mode`` and ``format_str`` here, the rest black's."""

    def __init__(self) -> None:
        super().__init__(NAME, "a stand-in for black until it is used (mlir_nn.egraph.deferred_black)")
        self.Mode = _Mode
        self.format_str = _format_str

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # what a walk of sys.modules asks every module (inspect.getmodule: __file__)
            raise AttributeError(name)
        return getattr(_black(), name)


@contextmanager
def black_deferred() -> Iterator[None]:
    """Imports in the block (egglog's) get the stand-in for black, unless black or egglog is
    imported already."""
    if NAME in sys.modules or "egglog" in sys.modules:
        yield
        return
    stand_in = sys.modules[NAME] = _StandIn()
    try:
        yield
    finally:
        if sys.modules.get(NAME) is stand_in:
            del sys.modules[NAME]
