"""The error of the cpu backend's native side: building, JIT-compiling, linking or loading code."""


class NativeError(RuntimeError):
    """JIT compilation, linking or loading failed."""
