"""The host CPU as the code generator sees it: vector width and register-block shape (no MLIR import)."""

from __future__ import annotations

from functools import cache


@cache
def vector_bytes() -> int:
    """Width of the host's vector registers: 64 with AVX-512, 32 with AVX2, else 16."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16


def register_block(itemsize: int) -> tuple[int, int]:
    """(rows, columns) of one matmul register block: two vector registers per row of accumulators."""
    width = vector_bytes()
    rows = 12 if width == 64 else 6 if width == 32 else 4  # accumulators fill about 3/4 of the registers
    return rows, 2 * width // itemsize
