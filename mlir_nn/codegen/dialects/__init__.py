"""Python modules of MLIR dialects that the bindings load in place of ``mlir.dialects``' own
(``linalg_ops.light_dialect_modules``); a dialect without one here loads MLIR's."""
