"""Running compiled artifacts: needs numpy and, for CUDA, cuda-bindings; never MLIR or egglog."""
