"""The rulesets, each a named list of rules with the identity it encodes.

Every module holds ``RULES``: ``(name, egglog rule)`` pairs, and ``RULESET``, the egglog
ruleset built from them, and may hold ``NEEDS_OPS``: the ops without which its rules cannot
match (the optimizer's default rulesets leave it out for a graph without any). ``RULESETS``
maps the public names to those modules in the order one saturation iteration runs them.
"""

from __future__ import annotations

from types import ModuleType

from mlir_nn.egraph.rules import algebra, classification, conv, fusion, images, layout, mse, update

RULESETS: dict[str, ModuleType] = {
    "algebra": algebra, "layout": layout, "fusion": fusion, "mse": mse, "update": update,
    "classification": classification, "conv": conv, "images": images,
}

__all__ = ["RULESETS"]
