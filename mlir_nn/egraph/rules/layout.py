"""Layout: a transposed matmul operand becomes a transpose flag, so no transpose is
materialized (op(A) reads A in either order). For 2-D A: A^T @ B == matmul(A, B,
transpose_a=True), and a flag already set flips back: (A^T)^T @ B == A @ B.
"""

from __future__ import annotations

from egglog import rewrite

from mlir_nn.egraph.rules.common import P2, a, b, build, ta, tb
from mlir_nn.egraph.terms import Term

RULES = [
    *[(f"op(A^T) @ B = matmul(A, B, transpose_a={not f})",
       rewrite(Term.matmul(Term.transpose(a, P2), b, f, tb)).to(Term.matmul(a, b, not f, tb)))
      for f in (False, True)],
    *[(f"A @ op(B^T) = matmul(A, B, transpose_b={not f})",
       rewrite(Term.matmul(a, Term.transpose(b, P2), ta, f)).to(Term.matmul(a, b, ta, not f)))
      for f in (False, True)],
]
RULESET = build("layout", RULES)
