"""The e-graph optimizer: egglog equality saturation over the tensor IR.

``optimize(graph, batch_estimate=...) -> (Graph, Report)`` is the entry point; the
rulesets live in ``mlir_nn.egraph.rules``, the cost model in ``mlir_nn.egraph.cost``.
"""

from mlir_nn.egraph.cost import CostModel
from mlir_nn.egraph.driver import Limits, Report, optimize
from mlir_nn.egraph.rules import RULESETS

__all__ = ["RULESETS", "CostModel", "Limits", "Report", "optimize"]
