"""Pattern variables and helpers shared by the rulesets."""

from __future__ import annotations

from egglog import Bool, String, Vec, f64, i64, ruleset, var, vars_

from mlir_nn.egraph.terms import Term

a, b, c, e, g, p, w, x, y, z = vars_("a b c e g p w x y z", Term)
ta, tb = vars_("ta tb", Bool)
k, k2 = vars_("k k2", f64)
dt = var("dt", String)
s, sa = vars_("s sa", Vec[i64])
P2 = Vec[i64](1, 0)  # the perm of a 2-D transpose


def build(name: str, rules: list[tuple[str, object]]):
    """An egglog ruleset named ``name`` holding the rules."""
    return ruleset(*(rule for _, rule in rules), name=name)
