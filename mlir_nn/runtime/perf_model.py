"""A roofline model of a compiled CUDA step, for tracking progress between device runs.

It is a model, not a measurement. Per Graph node (the kernels named after it), the
compile side stores in the artifact the node's FLOPs and compulsory global-memory bytes
as ``a * batch + b`` (``node_costs``). Here, without MLIR or a GPU, each kernel gets its
registers, shared memory and spills from ``ptxas -v`` on the artifact's PTX and, from the
PTX text, its static FMA and shared-load instructions and the bytes those loads read per
thread (``ld.shared.v4.b32``: 16); occupancy follows from those and the block size. The
predicted time of a node is the largest of its FLOPs at the fp32 peak of the SMs its grid
occupies (``min(1, blocks / 132)`` of the GPU: a product of 128 blocks leaves 4 SMs idle),
its bytes at the memory bandwidth and its shared-memory traffic (FMAs x shared bytes per
FMA, every thread's bytes counted: an upper bound, as threads of a warp reading one address
share a transfer) at the shared-memory bandwidth, plus a fixed cost per launch. A product over the
batch has one kernel per tiling (``mlir_nn.gpu.matmul``); only the launched one counts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Published H200 (SXM) figures; shared memory: 128 bytes/clock/SM x 132 SMs x 1.98 GHz.
H200 = {"fp32_flops": 67e12, "dram_bytes": 4.8e12, "shared_bytes": 33e12, "sms": 132,
        "regs_per_sm": 65536, "smem_per_sm": 228 * 1024, "threads_per_sm": 2048, "blocks_per_sm": 32}
LAUNCH_S = 2e-6  # per kernel launch without a CUDA graph (an assumption of the model)


@dataclass
class KernelResources:
    registers: int
    smem: int
    spill_bytes: int
    fma: int  # static fma.rn.f32 instructions in the PTX
    shared_loads: int  # static ld.shared instructions in the PTX
    shared_load_bytes: int = 0  # what those read per thread (a v4 load of b32: 16 bytes)


def shared_load_bytes(body: str) -> int:
    """Bytes per thread of the ``ld.shared`` instructions of a PTX body (vector width x element size)."""
    return sum(int(v or 1) * int(bits) // 8 for v, bits in re.findall(r"ld\.shared(?:\.v(\d))?\.[bfus](\d+)", body))


def ptx_bodies(ptx: str) -> dict[str, str]:
    """Entry name -> its PTX text."""
    return dict(re.findall(r"\.entry\s+(\w+)(.*?)(?=\.entry|\Z)", ptx, re.S))


def ptxas_resources(ptx: str, arch: str) -> dict[str, KernelResources]:
    """Per kernel: ``ptxas -v`` registers, shared memory and spills, and static FMA/shared-load counts."""
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not Path(ptxas).exists():
        raise FileNotFoundError("ptxas not found: the performance model needs the CUDA toolkit's ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "step.ptx"
        src.write_text(ptx)
        proc = subprocess.run([ptxas, "-v", f"-arch={arch}", str(src), "-o", str(Path(tmp) / "step.cubin")],
                              capture_output=True, text=True, check=True)
    out: dict[str, KernelResources] = {}
    current = None
    spills = 0
    for line in proc.stderr.splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spills = int(m.group(1)) + int(m.group(2))
            continue
        m = re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)
        if m and current:
            body = ptx_bodies(ptx).get(current, "")
            out[current] = KernelResources(int(m.group(1)), int(m.group(2) or 0), spills,
                                           body.count("fma.rn.f32"), len(re.findall(r"ld\.shared", body)),
                                           shared_load_bytes(body))
            current, spills = None, 0
    return out


def occupancy(res: KernelResources, threads: int, gpu: dict[str, Any] = H200) -> tuple[int, float]:
    """(resident blocks per SM, fraction of the SM's warps in use) from registers, shared memory, threads."""
    warps = -(-threads // 32)
    regs_per_warp = -(-res.registers * 32 // 256) * 256
    limits = [gpu["blocks_per_sm"], gpu["threads_per_sm"] // (warps * 32)]
    if res.registers:
        limits.append(gpu["regs_per_sm"] // (regs_per_warp * warps))
    if res.smem:
        limits.append(gpu["smem_per_sm"] // res.smem)
    blocks = max(0, min(limits))
    return blocks, blocks * warps * 32 / gpu["threads_per_sm"]


def predict(model: list[dict[str, Any]], resources: dict[str, KernelResources], blocks: dict[str, int],
            batch: int, gpu: dict[str, Any] = H200, grids: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One row per Graph node: FLOPs, bytes, shared bytes, kernels' resources and the predicted seconds.

    ``blocks``: threads per block of each kernel; ``grids``: blocks per launch (default: enough for every SM).
    """
    grids = grids or {}
    rows = []
    for node in model:
        flops = node["flops"][0] * batch + node["flops"][1]
        nbytes = node["bytes"][0] * batch + node["bytes"][1]
        kernels = [k for k in node["kernels"] if k in resources]
        tiled = [resources[k] for k in kernels if resources[k].shared_loads and resources[k].fma]
        ratio = min((r.fma / r.shared_loads for r in tiled), default=None)
        shared = (flops / 2) * max(r.shared_load_bytes / r.fma for r in tiled) if tiled else 0.0
        occ = [occupancy(resources[k], blocks.get(k, 256), gpu) for k in kernels]
        # the node's widest launch: its partial sums or product, not a one-block total or init
        used = min(1.0, max((grids[k] for k in kernels if k in grids), default=gpu["sms"]) / gpu["sms"])
        seconds = max(flops / (gpu["fp32_flops"] * used), nbytes / gpu["dram_bytes"], shared / gpu["shared_bytes"])
        rows.append({
            "node": node["op"], "kernels": kernels, "flops": flops, "bytes": nbytes, "shared_bytes": shared,
            "fma_per_shared_load": round(ratio, 2) if ratio else None,
            "registers": [resources[k].registers for k in kernels], "smem": [resources[k].smem for k in kernels],
            "spill_bytes": sum(resources[k].spill_bytes for k in kernels),
            "blocks_per_sm": [b for b, _ in occ], "occupancy": [round(o, 2) for _, o in occ],
            "grid_blocks": [grids[k] for k in kernels if k in grids], "sm_fraction": round(used, 3),
            "seconds": seconds + LAUNCH_S * len(kernels),
        })
    return rows
