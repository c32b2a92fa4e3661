"""The rulesets, each a named list of rules with the identity it encodes.

Every module holds ``RULES``: ``(name, egglog rule)`` pairs, and ``RULESET``, the egglog
ruleset built from them. ``NEEDS_OPS`` maps a ruleset to the ops without which its rules
cannot match (the optimizer's default rulesets leave it out for a graph without any).
``RULESETS`` maps the public names to those modules in the order one saturation iteration
runs them; a module is imported when first looked up, so that one a graph does not need is
never built (the images ruleset's rules took 0.06 s to import, a fifth of the e-graph stage of
a cold compile of an MLP, egglog's import included).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from importlib import import_module
from types import ModuleType

from mlir_nn.support.interrupts import interrupts_deferred

# A ruleset runs only on graphs with one of these ops: every rule of it has one in its pattern, and no
# other ruleset makes one from ops outside the set (on an MLP the images rules cost a third more optimize
# time; building the conv rules' egglog declarations took 0.04-0.07 s of each process that optimizes one)
NEEDS_OPS: dict[str, frozenset[str]] = {
    "mse": frozenset({"mse", "mse_grad"}),
    "classification": frozenset({"log_softmax_grad"}),
    "conv": frozenset({"conv2d", "conv2d_bias", "conv2d_weight_grad"}),
    "images": frozenset({"conv2d", "conv2d_bias", "conv2d_input_grad", "conv2d_weight_grad", "conv2d_weight_update",
                         "max_pool2d", "max_pool2d_index", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad"}),
}


class Rulesets(MutableMapping[str, ModuleType]):
    """Ruleset name -> its module, imported on first lookup."""

    def __init__(self, names: list[str]) -> None:
        self._entries: dict[str, ModuleType | str] = {name: f"{__name__}.{name}" for name in names}

    def __getitem__(self, name: str) -> ModuleType:
        entry = self._entries[name]
        if isinstance(entry, str):
            with interrupts_deferred():  # egglog's declarations are made as the module loads: never half made
                entry = self._entries[name] = import_module(entry)
        return entry

    def __setitem__(self, name: str, module: ModuleType) -> None:
        self._entries[name] = module

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


RULESETS = Rulesets(["algebra", "layout", "fusion", "mse", "update", "classification", "conv", "images"])

__all__ = ["NEEDS_OPS", "RULESETS"]
