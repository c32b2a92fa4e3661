"""One prepared visit to a GPU machine: check the precompiled artifacts, then time them.

Needs numpy, cuda-bindings and (for the peers) PyTorch with CUDA; not MLIR or egglog.
Usage: ``python benchmarks/gpu_check.py RESULTS_DIR [--artifacts benchmarks/artifacts]``
(artifacts from ``make gpu-artifacts``). For every case and batch size it runs one step
through ``mlir_nn.runtime.cuda`` and compares the outputs and updated parameters with
the saved NumPy reference; only then it times the step against PyTorch CUDA and, for
single ops, the hand-written kernels (``libmlirnn_kernels.so``, built here with CMake
when nvcc is present). Results go to RESULTS_DIR/gpu_check.json and stdout.
``--dry-run`` does everything that needs no GPU (load each artifact, bind its plan for every
batch size, check every launch against the PTX, check the saved references), so a machine
without one can check that the payload is complete, and prints the roofline model of each
case at its first batch size (``mlir_nn.runtime.perf_model``: per node FLOPs, bytes, shared
traffic, registers, occupancy from ``ptxas -v``, predicted time on an H200), next to the
measured step time when ``--measured`` names an earlier run's gpu_check.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_cases import CASES, inputs_for, sample_positions  # noqa: E402

from mlir_nn.runtime.artifact import Artifact  # noqa: E402
from mlir_nn.runtime.cuda import CudaStep  # noqa: E402
from mlir_nn.runtime.driver import Device  # noqa: E402
from mlir_nn.runtime.perf_model import predict, ptxas_resources  # noqa: E402
from mlir_nn.runtime.plan import bind, check_launch_abi  # noqa: E402

RTOL, ATOL = 2e-3, 2e-4  # float32, sums of up to ~1000 products in a different order


def timed(fn, sync, repeat: int = 20, warmup: int = 3) -> float:
    """Median seconds of ``fn`` (synchronized)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def check_case(name: str, case: dict, step: CudaStep, ref: dict) -> dict:
    params = [ref[f"param{i}"] for i in range(len(step.artifact.signature["params"]))]
    result = {}
    for batch in case["batches"]:
        step.upload_params([p.copy() for p in params])
        outputs = step.step(inputs_for(case, batch))
        got_params = step.download_params()
        errors = []
        for i, o in enumerate(outputs):
            want = ref[f"b{batch}_out{i}"]
            errors.append(("output", i, float(np.max(np.abs(o - want), initial=0.0)), np.allclose(o, want, RTOL, ATOL)))
        for i, slot in enumerate(step.update_slots):
            got = got_params[slot].ravel()[sample_positions(got_params[slot].size)]
            want = ref[f"b{batch}_update{i}"]
            errors.append(("update", i, float(np.max(np.abs(got - want), initial=0.0)),
                           np.allclose(got, want, RTOL, ATOL)))
        result[str(batch)] = {"ok": all(e[3] for e in errors), "max_abs_err": max((e[2] for e in errors), default=0.0),
                              "failures": [f"{k}{i}" for k, i, _, ok in errors if not ok]}
    return result


def dry_check(case: dict, artifact: Artifact, ref: dict) -> dict:
    """What check_case reads and launches, without a device: plans, ABI, reference arrays."""
    sig = artifact.signature
    params = [ref[f"param{i}"] for i in range(len(sig["params"]))]
    for p, d in zip(params, sig["params"]):
        if list(p.shape) != d["shape"] or p.dtype != np.dtype(d["dtype"]):
            raise ValueError(f"reference parameter {d['name']} is {p.dtype}{p.shape}, artifact wants {d}")
    result = {}
    for batch in case["batches"]:
        inputs = inputs_for(case, batch)
        bound = bind(artifact.plan, [a.shape for a in inputs] + [p.shape for p in params])
        launches = [a for a in bound.actions if hasattr(a, "kernel")]
        for launch in launches:
            check_launch_abi(launch, artifact.ptx[launch.binary])
        outs = [ref[f"b{batch}_out{i}"] for i in range(len(sig["outputs"]))]
        updates = [ref[f"b{batch}_update{i}"] for i in range(len(sig["updates"]))]
        for view, want in zip(bound.results, outs):
            if view.shape != want.shape:
                raise ValueError(f"batch {batch}: output {view.shape} vs reference {want.shape}")
        result[str(batch)] = {"launches": len(launches), "outputs": len(outs), "updates": len(updates)}
    return result


def torch_step(case: dict, params: list[np.ndarray], inputs: list[np.ndarray]):
    import torch

    dev = torch.device("cuda")
    ps = [torch.tensor(p, device=dev, requires_grad=case["kind"] == "mlp_step") for p in params]

    def run():
        xs = [torch.from_numpy(a).to(dev) for a in inputs]
        if case["kind"] == "mlp_step":
            h = xs[0]
            for layer in range(len(ps) // 2):
                h = h @ ps[2 * layer] + ps[2 * layer + 1]
                if layer < len(ps) // 2 - 1:
                    h = torch.relu(h)
            loss = torch.mean((h - xs[1]) ** 2)
            grads = torch.autograd.grad(loss, ps)
            with torch.no_grad():
                for p, g in zip(ps, grads):
                    p -= case["lr"] * g
            return loss.item()
        if case["op"] == "matmul":
            return (xs[0] @ ps[0]).cpu()
        if case["op"] == "linear_relu":
            return torch.relu(xs[0] @ ps[0] + ps[1]).cpu()
        return torch.mean((xs[0] - xs[1]) ** 2).item()

    return run, torch.cuda.synchronize


def handwritten_op(case: dict, params: list[np.ndarray], inputs: list[np.ndarray], lib_path: Path | None):
    """The op through libmlirnn_kernels.so on torch-allocated device memory (inputs already on device)."""
    import torch

    from mlir_nn.runtime.kernels import ReferenceKernels

    k = ReferenceKernels(lib_path)
    dev = torch.device("cuda")
    xs = [torch.from_numpy(a).to(dev) for a in inputs]
    ps = [torch.from_numpy(p).to(dev) for p in params]
    m = xs[0].shape[0]
    if case["op"] == "mse":
        loss = torch.empty((), device=dev)
        return lambda: k.mse(xs[0].data_ptr(), xs[1].data_ptr(), loss.data_ptr(), xs[0].numel()), k.synchronize
    kdim, n = ps[0].shape
    out = torch.empty((m, n), device=dev)
    tmp = torch.empty((m, n), device=dev)

    def run():
        k.matmul_tiled(xs[0].data_ptr(), ps[0].data_ptr(), out.data_ptr(), m, n, kdim)
        if case["op"] == "linear_relu":
            k.bias_add(out.data_ptr(), ps[1].data_ptr(), tmp.data_ptr(), m, n)
            k.relu(tmp.data_ptr(), out.data_ptr(), m * n)

    return run, k.synchronize


def build_kernels(results: Path) -> Path | None:
    """Build libmlirnn_kernels.so with CMake if nvcc is here; else use $MLIRNN_KERNELS_LIB."""
    if os.environ.get("MLIRNN_KERNELS_LIB"):
        return Path(os.environ["MLIRNN_KERNELS_LIB"])
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if not nvcc or not shutil.which("cmake"):
        return None
    build = results / "kernels-build"
    env = dict(os.environ, PATH=f"{Path(nvcc).parent}:{os.environ.get('PATH', '')}")
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build), "-j8"], ["ctest", "--test-dir", str(build), "--output-on-failure"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        (results / "kernels-build.log").open("a").write(proc.stdout + proc.stderr)
        if proc.returncode:
            print(f"kernel build step {' '.join(cmd[:2])} failed; see kernels-build.log")
            return None
    return build / "libmlirnn_kernels.so"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--artifacts", type=Path, default=ROOT / "benchmarks" / "artifacts")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dry-run", action="store_true", help="check the payload without a GPU")
    parser.add_argument("--measured", type=Path, help="with --dry-run: a device run's gpu_check.json to compare with")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        return dry_run(args)
    device = Device()
    report: dict = {"device": device.name, "arch": device.arch, "cases": {}}
    print(f"device: {device.name} ({device.arch})")
    lib = build_kernels(args.results)
    report["handwritten_lib"] = str(lib) if lib else None
    for name in args.cases:
        case = CASES[name]
        entry: dict = {}
        report["cases"][name] = entry
        try:
            artifact = Artifact.read(args.artifacts / f"{name}.mlirnn")
            ref = dict(np.load(args.artifacts / f"{name}.npz"))
            step = CudaStep(artifact, device)
            entry["kernels"] = artifact.info.get("kernels")
            entry["check"] = check_case(name, case, step, ref)
            entry["ok"] = all(r["ok"] for r in entry["check"].values())
            print(f"{name}: numerics {'OK' if entry['ok'] else 'MISMATCH'} {entry['check']}")
            if not entry["ok"]:
                continue
            batch = case["batches"][0]
            params = [ref[f"param{i}"] for i in range(len(artifact.signature["params"]))]
            inputs = inputs_for(case, batch)
            step.upload_params([p.copy() for p in params])
            entry["mlir_s"] = timed(functools.partial(step.step, inputs), lambda: None, args.repeat)
            try:
                run, sync = torch_step(case, params, inputs)
                entry["torch_s"] = timed(run, sync, args.repeat)
            except Exception as e:  # a missing or CPU-only torch is reported, not fatal
                entry["torch_error"] = repr(e)
            if case["kind"] == "op" and lib:
                try:
                    run, sync = handwritten_op(case, params, inputs, lib)
                    entry["handwritten_kernels_s"] = timed(run, sync, args.repeat)
                except Exception as e:
                    entry["handwritten_error"] = repr(e)
            timed_peers = [k for k in ("torch_s", "handwritten_kernels_s") if k in entry]
            entry["mlir_over"] = {k: entry["mlir_s"] / entry[k] for k in timed_peers}
            peers = ", ".join(f"{k} {entry[k] * 1e6:.0f} us" for k in timed_peers)
            print(f"{name} (batch {batch}): mlir {entry['mlir_s'] * 1e6:.0f} us; {peers}")
            step.close()
        except Exception as e:
            entry["error"] = "".join(traceback.format_exception(e))
            print(f"{name}: ERROR {e}")
    (args.results / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.results / 'gpu_check.json'}")
    return 0 if all(c.get("ok") for c in report["cases"].values()) else 1


def model_case(case: dict, artifact: Artifact, ref: dict) -> dict:
    """The roofline model (labelled as one) of the case's first batch size; prints a table."""
    batch = case["batches"][0]
    params = [ref[f"param{i}"] for i in range(len(artifact.signature["params"]))]
    bound = bind(artifact.plan, [a.shape for a in inputs_for(case, batch)] + [p.shape for p in params])
    threads = {a.kernel: a.block[0] * a.block[1] * a.block[2] for a in bound.actions if hasattr(a, "kernel")}
    grids = {a.kernel: a.grid[0] * a.grid[1] * a.grid[2] for a in bound.actions if hasattr(a, "kernel")}
    resources = {}
    for ptx in artifact.ptx.values():
        resources.update(ptxas_resources(ptx, artifact.arch))
    launched = [k for k in artifact.info["model"] for k in k["kernels"] if k in threads]
    rows = predict([dict(n, kernels=[k for k in n["kernels"] if k in threads]) for n in artifact.info["model"]],
                   resources, threads, batch, grids=grids)
    print(f"  MODEL (roofline on an H200: 67 TFLOP/s fp32, 4.8 TB/s; not a measurement), batch {batch}:")
    print(f"  {'node':<18}{'kernels':>8}{'tile':>6}{'blocks':>7}{'GFLOP':>9}{'MB':>9}{'shared MB':>10}"
          f"{'fma/ld.sh':>10}{'regs':>6}{'smem':>7}{'blk/SM':>7}{'occ':>6}{'us':>8}")
    for r in rows:
        ratio = f"{r['fma_per_shared_load']:.2f}" if r["fma_per_shared_load"] else "-"
        tiles = [m.group(1) for k in r["kernels"] if (m := re.search(r"_tile(\d+)$", k))]
        tile = tiles[0] if tiles else "-"
        print(f"  {r['node']:<18}{len(r['kernels']):>8}{tile:>6}{max(r['grid_blocks'], default=0):>7}"
              f"{r['flops'] / 1e9:>9.3f}{r['bytes'] / 1e6:>9.2f}{r['shared_bytes'] / 1e6:>10.2f}{ratio:>10}"
              f"{max(r['registers'], default=0):>6}{max(r['smem'], default=0):>7}"
              f"{min(r['blocks_per_sm'], default=0):>7}{min(r['occupancy'], default=0):>6.2f}"
              f"{r['seconds'] * 1e6:>8.1f}")
    total = sum(r["seconds"] for r in rows)
    spills = sum(r["spill_bytes"] for r in rows)
    print(f"  predicted step: {total * 1e6:.1f} us over {len(launched)} launches; spill bytes {spills}")
    return {"label": "roofline model, not a measurement", "batch": batch, "predicted_s": total, "nodes": rows}


def dry_run(args: argparse.Namespace) -> int:
    report: dict = {"dry_run": True, "cases": {}}
    measured = json.loads(args.measured.read_text())["cases"] if args.measured else {}
    for name in args.cases:
        try:
            artifact = Artifact.read(args.artifacts / f"{name}.mlirnn")
            ref = dict(np.load(args.artifacts / f"{name}.npz"))
            check = dry_check(CASES[name], artifact, ref)
            entry = {"ok": True, "kernels": artifact.info.get("kernels"), "check": check}
        except Exception as e:
            entry = {"ok": False, "error": "".join(traceback.format_exception(e))}
        report["cases"][name] = entry
        print(f"{name}: {'payload OK' if entry['ok'] else 'ERROR ' + entry['error']} {entry.get('check', '')}")
        if entry["ok"] and "model" in artifact.info and shutil.which("ptxas"):
            entry["model"] = model_case(CASES[name], artifact, ref)
            if "mlir_s" in measured.get(name, {}):
                print(f"  measured step: {measured[name]['mlir_s'] * 1e6:.1f} us")
    (args.results / "gpu_check.json").write_text(json.dumps(report, indent=1))
    return 0 if all(c["ok"] for c in report["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
