"""The e-graph optimizer: egglog equality saturation over the tensor IR.

``optimize(graph, batch_estimate=...) -> (Graph, Report)`` is the entry point; the
rulesets live in ``mlir_nn.egraph.rules``, the cost model in ``mlir_nn.egraph.cost``.
``mlir_nn.egraph.cache.optimize_cached`` remembers results on disk. Names are imported
on first use, so a process that finds its optimized graph in the cache never loads egglog.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {"CostModel": "cost", "Limits": "driver", "Report": "report", "optimize": "driver", "RULESETS": "rules"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mlir_nn.egraph' has no attribute {name!r}")
    return getattr(import_module(f"mlir_nn.egraph.{_EXPORTS[name]}"), name)
