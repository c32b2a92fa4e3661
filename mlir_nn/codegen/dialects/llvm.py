"""The llvm dialect as MLIR's bindings load it when Python first meets an llvm op (the walks of
a lowered step): no op classes, since mlir-nn reads and builds llvm ops through the generic
``Operation`` API and parsed text (``fp_env``). ``mlir.dialects.llvm`` (its generated op classes:
10-11 ms to import) loads only where it is imported."""
