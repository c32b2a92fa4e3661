"""The host CPU as the code generator sees it: vector width, caches, register and cache blocks (no MLIR import)."""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
DEFAULT_CACHES = {1: 32 << 10, 2: 512 << 10}  # bytes of L1d and L2 when sysfs does not say
CACHE_LINE = 64  # bytes
IN_PLACE_KC_MIN = 32  # shallower slices load and store each register block's accumulators too often
# "vector bytes,L1d KiB,L2 KiB": the target the code generator plans for instead of the host's (the
# code still compiles for the host, which runs wider vectors as several); the code generator's
# schedule tests pin the one they were written for
PLANNED_TARGET_ENV = "MLIR_NN_CPU_TARGET"


def planned_target() -> tuple[int, int, int] | None:
    """``$MLIR_NN_CPU_TARGET`` as (vector bytes, L1d bytes, L2 bytes), or None when unset; a
    ValueError that names the variable when it is malformed."""
    text = os.environ.get(PLANNED_TARGET_ENV, "").strip()
    if not text:
        return None
    try:
        width, l1, l2 = (int(part) for part in text.split(","))
    except ValueError:
        width = l1 = l2 = 0
    if width not in (16, 32, 64) or min(l1, l2) < 1:
        raise ValueError(f"{PLANNED_TARGET_ENV} must be 'vector bytes (16, 32 or 64),L1d KiB,L2 KiB', got {text!r}")
    return width, l1 << 10, l2 << 10


@cache
def vector_bytes() -> int:
    """Width of the host's vector registers: 64 with AVX-512, 32 with AVX2, else 16 (or the
    planned target's, ``PLANNED_TARGET_ENV``)."""
    if (pinned := planned_target()) is not None:
        return pinned[0]
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return 64 if "avx512f" in flags else 32 if "avx2" in flags else 16


@cache
def cpu_identity() -> str:
    """A short name of the host CPU for what is measured once per machine: a sha256 prefix of its
    model name, its flags and its core count (/proc/cpuinfo; the core count alone where that
    cannot be read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    text = "\0".join((fields.get("model name", ""), fields.get("flags", ""), str(os.cpu_count())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def register_block(itemsize: int) -> tuple[int, int]:
    """(rows, columns) of one matmul register block: two vector registers per row of accumulators."""
    width = vector_bytes()
    rows = 12 if width == 64 else 6 if width == 32 else 4  # accumulators fill about 3/4 of the registers
    return rows, 2 * width // itemsize


def _size_bytes(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


@cache
def data_cache_bytes() -> dict[int, int]:
    """Per-core data cache sizes by level (1: L1d, 2: L2) from sysfs, with defaults (or the
    planned target's, ``PLANNED_TARGET_ENV``)."""
    if (pinned := planned_target()) is not None:
        return {1: pinned[1], 2: pinned[2]}
    found = dict(DEFAULT_CACHES)
    try:
        for entry in CACHE_SYSFS.glob("index*"):
            kind = (entry / "type").read_text().strip()
            level = int((entry / "level").read_text())
            if kind in ("Data", "Unified") and level in found:
                found[level] = _size_bytes((entry / "size").read_text())
    except (OSError, ValueError):
        return dict(DEFAULT_CACHES)
    return found


def cache_blocks(itemsize: int) -> tuple[int, int, int]:
    """(mc, nc, kc) of the blocked matmul, GotoBLAS-style: a kc-deep slice of one packed
    column panel (kc x register columns) fills half of L1, an mc x kc block of A at most a
    quarter of L2 (and at most 16 register rows, so that tasks stay small enough to
    balance), and a task covers nc columns."""
    tm, tn = register_block(itemsize)
    caches = data_cache_bytes()
    kc = max(16, min(512, caches[1] // 2 // (tn * itemsize)) // 16 * 16)
    mc = max(tm, min(16 * tm, caches[2] // 4 // (kc * itemsize) // tm * tm))
    nc = 16 * tn
    return mc, nc, kc


def in_place_kc(row_bytes: int, itemsize: int) -> int:
    """kc for a product whose tasks read, per k, ``row_bytes`` of A in place from rows far apart
    (x of a weight gradient x^T g, a task sweeping all of x's columns): as deep as lets those
    rows' cache lines and a slice of one packed column panel fill 3/4 of L1, so that each slice of x is
    read from L2 once and then from L1 for every column panel; in steps of 16, at least
    IN_PLACE_KC_MIN, never deeper than ``cache_blocks``'. Measured on Zen 3 (L1d 32 KiB): kc 32 to 64
    instead of 256 for 100-wide layers (7 lines of x per batch row) made the 100-100-100-100-1 Adam
    step at batch 5000 3% faster."""
    per_k = -(-row_bytes // CACHE_LINE) * CACHE_LINE + register_block(itemsize)[1] * itemsize
    depth = data_cache_bytes()[1] * 3 // 4 // per_k // 16 * 16
    return max(IN_PLACE_KC_MIN, min(cache_blocks(itemsize)[2], depth))


def deep_kc(rows: int, itemsize: int) -> int:
    """kc for a product whose tasks each sweep ``rows`` rows of A: as deep as lets that block of A
    (rows x kc) fill 3/4 of L2 and a slice of one packed column panel (kc x register columns)
    an eighth of it, never shallower than ``cache_blocks``'. The slice then streams from L2 rather
    than staying in L1, but each register block's accumulators are loaded and stored once per
    kc: measured on Zen 3 (L2 512 KiB), kc 1024 for tasks of 96 rows made the 784-1024-1024-10
    step at batch 512 4.5% faster; kc 512 for tasks of all 256 rows of a weight gradient (a block of
    A as large as L2) made the 256-256-256-10 step 3-5% slower."""
    tn = register_block(itemsize)[1]
    l2, shallow = data_cache_bytes()[2], cache_blocks(itemsize)[2]
    deep = min(l2 * 3 // 4 // (max(1, rows) * itemsize), l2 // 8 // (tn * itemsize)) // 16 * 16
    return max(shallow, deep)
