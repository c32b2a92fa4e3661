"""What the optimizer did (a light module: reading a cached report needs no egglog)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Report:
    """What the optimizer did, for ``--stats`` and for tests."""

    rules_applied: dict[str, int] = field(default_factory=dict)  # rule name -> matches, where > 0
    iterations: int = 0
    egraph_nodes: int = 0
    egraph_classes: int = 0
    stop_reason: str = "not run"  # saturated | iteration limit | node limit | time limit | error
    seconds: float = 0.0
    stage_seconds: dict[str, float] = field(default_factory=dict)  # load, saturate, extract, verify
    nodes_before: int = 0
    nodes_after: int = 0
    kernels_before: int = 0
    kernels_after: int = 0
    cost_before: float = 0.0
    cost_after: float = 0.0
    batch_estimate: int = 0
    used_optimized: bool = False
    error: str | None = None

    def __str__(self) -> str:
        lines = [
            f"egraph: {self.stop_reason} after {self.iterations} iterations in {self.seconds * 1e3:.1f} ms, "
            f"{self.egraph_nodes} e-nodes in {self.egraph_classes} e-classes",
            "stages: " + ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in self.stage_seconds.items()),
            f"nodes: {self.nodes_before} -> {self.nodes_after} compute nodes, "
            f"{self.kernels_before} -> {self.kernels_after} kernels",
            f"estimated cost (batch {self.batch_estimate}): {self.cost_before:,.0f} -> {self.cost_after:,.0f}"
            + (f" ({self.cost_after / self.cost_before:.2f}x)" if self.cost_before else ""),
        ]
        if self.error:
            lines.append(f"optimizer failed, using the traced graph: {self.error}")
        elif not self.used_optimized:
            lines.append("the traced graph is kept (no cheaper program found)")
        lines.append("rules applied (matches):" + ("" if self.rules_applied else " none"))
        lines += [f"  {n:5d}  {name}" for name, n in sorted(self.rules_applied.items(), key=lambda kv: -kv[1])]
        return "\n".join(lines)
