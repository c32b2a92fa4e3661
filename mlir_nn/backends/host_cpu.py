"""The host CPU as LLVM sees it, and the target attributes every compiled function carries.

MLIR's JIT compiles for the host's CPU and features. Its cost model for AVX-512 gathers and
scatters is optimistic on the AMD cores of our machines: LLVM vectorized strided loops (an
im2col copy, a max-pool's windows, a per-channel sum after unrolling its inner loop) into
``vgatherqps``/``vscatterqps``, slower there than the plain scalar loop, and a VGG-small step
on one thread spent about a sixth of its time in them. So each function gets the host's own
CPU name and feature string plus ``+prefer-no-gather,+prefer-no-scatter``; a function's
``target-features`` replace the JIT's, hence the host's string in full, as ``opt -mcpu=native``
reports it. Where that tool is missing or fails, functions keep the JIT's defaults.
"""

from __future__ import annotations

import re
import subprocess
import threading
from functools import cache
from typing import TYPE_CHECKING

from mlir_nn.backends.native import llvm_tool

if TYPE_CHECKING:  # MLIR is imported only to tune a module (loading a cached step does without it)
    from mlir import ir

PREFERENCES = ("+prefer-no-gather", "+prefer-no-scatter")
_PROBE = "define void @probe() {\n  ret void\n}\n"
_ATTRIBUTE = re.compile(r'"(target-cpu|target-features)"="([^"]*)"')


def _run(command: list[str], stdin: str = "") -> str | None:
    try:
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


_PROBING = threading.Lock()


def host_target() -> tuple[str, tuple[str, ...]] | None:
    """(CPU name, features) of the host as LLVM detects them, or None when LLVM's tools are not
    found or do not say (asked once per process)."""
    with _PROBING:
        return _probe()


def prepare() -> None:
    """Ask LLVM in the background (two subprocesses, about 40 ms) while a step lowers."""
    threading.Thread(target=host_target, daemon=True).start()


@cache
def _probe() -> tuple[str, tuple[str, ...]] | None:
    opt, config = llvm_tool("opt"), llvm_tool("llvm-config")
    triple = _run([config, "--host-target"]) if config else None
    if opt is None or not triple:
        return None
    found = dict(_ATTRIBUTE.findall(_run([opt, f"-mtriple={triple.strip()}", "-mcpu=native", "-S"], _PROBE) or ""))
    if not found.get("target-cpu") or not found.get("target-features"):
        return None
    return found["target-cpu"], tuple(found["target-features"].split(","))


def target_features() -> tuple[str, ...] | None:
    """The features each compiled function is given: the host's and PREFERENCES."""
    host = host_target()
    if host is None:
        return None
    preferred = {p[1:] for p in PREFERENCES}
    kept = [feature for feature in host[1] if feature[1:] not in preferred]
    return (*kept, *PREFERENCES)


def tune_for_host(module: ir.Module) -> None:
    """Give each function defined in the LLVM-dialect ``module`` the host's CPU name and
    ``target_features`` (nothing when the host is unknown)."""
    from mlir import ir

    host, features = host_target(), target_features()
    if host is None or features is None:
        return
    cpu = ir.StringAttr.get(host[0])
    attribute = ir.Attribute.parse("#llvm.target_features<[" + ", ".join(f'"{f}"' for f in features) + "]>")
    for op in [op.operation for op in module.body.operations]:
        if op.name == "llvm.func" and op.regions[0].blocks:
            op.attributes["target_cpu"] = cpu
            op.attributes["target_features"] = attribute
