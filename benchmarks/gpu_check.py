"""One prepared visit to a GPU machine: check the precompiled artifacts, then time them.

Needs numpy, cuda-bindings, tqdm and (for the peers) PyTorch with CUDA; not MLIR or egglog.
Usage: ``python benchmarks/gpu_check.py RESULTS_DIR [--artifacts benchmarks/artifacts]``
(artifacts from ``make gpu-artifacts``, which travel as one folder: that folder and this
command are the whole visit). The visit, prepared here from the tree that is sent:

    make gpu-artifacts && python benchmarks/gpu_check.py /tmp/dry --dry-run    # here, no GPU
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py RESULTS_DIR             # there, benchmarks/artifacts carried

The caches in the folder are keyed by the sources that produced them, so an edit after
``make gpu-artifacts`` shows up as a dry-run error here rather than a compile there.

For every case and batch size it runs one step
through ``mlir_nn.runtime.cuda`` and compares the outputs and updated parameters with
the saved NumPy reference; only then it times the step against PyTorch CUDA and, for
single ops, the hand-written kernels (``libmlirnn_kernels.so``, built here with CMake
when nvcc is present). Then the resident-training check (``gpu_cases.trainer_case``):
``Trainer(..., backend="cuda")`` on steps from the artifacts' cache folder against the NumPy
reference (losses, validation losses, parameters and momentum buffers), the parameter
copies it made, and the time per step of its compiled step in a resident block, the same
step copying the parameters every call, a whole Trainer epoch, and PyTorch CUDA's step.
Results go to RESULTS_DIR/gpu_check.json and stdout.
``--dry-run`` does everything that needs no GPU (load each artifact, bind its plan for every
batch size, check every launch against the PTX, check the saved references), so a machine
without one can check that the payload is complete, and prints the roofline model of each
case at its first batch size (``mlir_nn.runtime.perf_model``: per node FLOPs, bytes, shared
traffic, registers, occupancy from ``ptxas -v``, predicted time on an H200), next to the
measured step time when ``--measured`` names an earlier run's gpu_check.json; for the
Trainer case it checks that every step is found in the artifacts' caches without egglog
or MLIR, and binds and ABI-checks their plans.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_cases import (  # noqa: E402
    CASES,
    TRAINER_CASE,
    cnn,
    inputs_for,
    sample_positions,
    trainer_case,
    trainer_steps,
)

import mlir_nn  # noqa: E402
from mlir_nn.backends import cuda_cache  # noqa: E402
from mlir_nn.runtime.artifact import Artifact  # noqa: E402
from mlir_nn.runtime.cuda import CudaStep  # noqa: E402
from mlir_nn.runtime.driver import Device  # noqa: E402
from mlir_nn.runtime.perf_model import predict, ptxas_resources  # noqa: E402
from mlir_nn.runtime.plan import bind, check_launch_abi  # noqa: E402
from mlir_nn.trainer import Task  # noqa: E402

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

    if case["kind"] == "gpt_step":
        raise NotImplementedError("the GPT step has no PyTorch twin here: its numerics and its time are checked")
    dev = torch.device("cuda")
    ps = [torch.tensor(p, device=dev, requires_grad=case["kind"] in ("mlp_step", "cnn_step")) for p in params]
    if case["kind"] == "cnn_step":
        model = cnn(torch.nn, case).to(dev)
        with torch.no_grad():
            for p, value in zip(model.parameters(), ps):
                p.copy_(value)
        opt = torch.optim.SGD(model.parameters(), lr=case["lr"])

    def run():
        xs = [torch.from_numpy(a).to(dev) for a in inputs]
        if case["kind"] == "cnn_step":
            loss = torch.mean((model(xs[0]) - xs[1]) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()
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
    build = Path(tempfile.mkdtemp(prefix="mlirnn-kernels-"))  # not in RESULTS_DIR: only files come back
    env = dict(os.environ, PATH=f"{Path(nvcc).parent}:{os.environ.get('PATH', '')}")
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build), "-j8"], ["ctest", "--test-dir", str(build), "--output-on-failure"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        (results / "kernels-build.log").open("a").write(proc.stdout + proc.stderr)
        if proc.returncode:
            print(f"kernel build step {' '.join(cmd[:2])} failed; see kernels-build.log")
            return None
    return build / "libmlirnn_kernels.so"


def _trainer_state(model, opt) -> list[np.ndarray]:
    return [p.data.copy() for p in model.parameters()] + \
        [t.data.copy() for slot in opt.state.values() for t in slot.values()]


def _train(backend: str, epochs: int = TRAINER_CASE["epochs"]) -> tuple:
    """(trainer, model, opt, data, history) after the Trainer case's epochs on ``backend``."""
    trainer, model, opt, (X, y, X_val, y_val) = trainer_case(backend)
    random.seed(0)
    history = trainer.train(X, y, n_epochs=epochs, batch_size=TRAINER_CASE["batch_size"],
                            validation_data=(X_val, y_val), verbose=False, early_stopping=False)
    return trainer, model, opt, (X, y, X_val, y_val), history


def _batches(X: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The Trainer's mini-batches of one epoch (in order), as its step sees them."""
    X, y = X.astype(np.float32), y.astype(np.float32)
    targets = Task(y, 1).targets(y)
    size = TRAINER_CASE["batch_size"]
    return [(X[i:i + size], targets[i:i + size]) for i in range(0, len(X), size)]


def torch_epoch(batches: list[tuple[np.ndarray, np.ndarray]]):
    """PyTorch CUDA's epoch of the same MLP, SGD with momentum and mse, reading each loss as the Trainer does."""
    import torch

    dev = torch.device("cuda")
    sizes = TRAINER_CASE["sizes"]
    layers = [torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())][:-1]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=TRAINER_CASE["lr"], momentum=TRAINER_CASE["momentum"])
    data = [(torch.from_numpy(x), torch.from_numpy(t)) for x, t in batches]

    def epoch():
        for x, t in data:
            loss = torch.mean((model(x.to(dev)) - t.to(dev)) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()

    return epoch, torch.cuda.synchronize


def resident_check(repeat: int) -> dict:
    """The Trainer case on cuda against the reference: numerics, parameter copies, step times."""
    trainer, model, opt, (X, y, X_val, y_val), history = _train("cuda")
    _, ref_model, ref_opt, _, ref_history = _train("numpy")
    errors = {}
    for key in ("losses", "val_losses"):
        errors[key] = float(np.max(np.abs(np.subtract(history[key], ref_history[key]))))
    got, want = _trainer_state(model, opt), _trainer_state(ref_model, ref_opt)
    errors["state"] = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    ok = all(np.allclose(history[k], ref_history[k], RTOL, ATOL) for k in ("losses", "val_losses")) \
        and all(np.allclose(g, w, RTOL, ATOL) for g, w in zip(got, want))
    train_step, forward = (c.executable.step for c in trainer_steps(trainer))
    epochs, weights = TRAINER_CASE["epochs"], len(model.parameters())
    # one upload of everything, the weights fetched for each validation, the momentum buffers at the end
    expected = {"train": {"to_device": len(train_step.param_shapes),
                          "to_host": epochs * weights + len(train_step.update_slots) - weights},
                "forward": {"to_device": epochs * weights, "to_host": 0}}
    copies = {"train": dict(train_step.param_copies), "forward": dict(forward.param_copies)}
    entry = {"ok": ok and copies == expected, "numerics_ok": ok, "max_abs_err": errors,
             "param_copies": copies, "expected_param_copies": expected}
    print(f"resident trainer: numerics {'OK' if ok else 'MISMATCH'} {errors}; copies {copies} "
          f"(expected {expected})")
    batches = _batches(X, y)
    step = next(iter(trainer._steps.values()))

    def epoch_of_steps():
        for x, t in batches:
            step(x, t)

    def resident_epoch():
        with mlir_nn.resident():
            epoch_of_steps()

    def trainer_epoch():
        trainer.train(X, y, n_epochs=1, batch_size=TRAINER_CASE["batch_size"], verbose=False, early_stopping=False)

    n = len(batches)
    times = {"resident_step_s": timed(resident_epoch, lambda: None, repeat) / n,
             "copying_step_s": timed(epoch_of_steps, lambda: None, repeat) / n,
             "trainer_step_s": timed(trainer_epoch, lambda: None, repeat) / n}
    try:
        run, sync = torch_epoch(batches)
        times["torch_step_s"] = timed(run, sync, repeat) / n
    except Exception as e:  # a missing or CPU-only torch is reported, not fatal
        entry["torch_error"] = repr(e)
    entry.update(times)
    print("resident trainer, per step: " + ", ".join(f"{k[:-2]} {v * 1e6:.0f} us" for k, v in times.items()))
    return entry


def dry_resident(arch: str) -> dict:
    """Without a GPU: every step of the Trainer case is in the artifacts' caches (optimizer and CUDA)
    and its plan binds for the batch sizes it will see, its launches matching the PTX."""
    trainer, _, _, (X, _, X_val, _), _ = _train("numpy", epochs=1)  # traces and optimizes from the caches
    found = []
    sizes = sorted({TRAINER_CASE["batch_size"], len(X) % TRAINER_CASE["batch_size"] or TRAINER_CASE["batch_size"]})
    for compiled, batches in zip(trainer_steps(trainer), (sizes, [len(X_val)])):
        artifact = cuda_cache.load(compiled.optimized_graph, arch)
        if artifact is None:
            raise FileNotFoundError(f"{compiled.graph.name}: no CUDA artifact for {arch} in the cache "
                                    f"({cuda_cache.entry_path(compiled.optimized_graph, arch)})")
        for batch in batches:
            shapes = [(batch, *(d for d in i["shape"][1:])) for i in artifact.signature["inputs"]]
            bound = bind(artifact.plan, shapes + [tuple(p["shape"]) for p in artifact.signature["params"]])
            for launch in (a for a in bound.actions if hasattr(a, "kernel")):
                check_launch_abi(launch, artifact.ptx[launch.binary])
        found.append({"step": compiled.graph.name, "kernels": artifact.info.get("kernels"), "batches": batches})
    return {"ok": True, "steps": found}


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
    if (args.artifacts / "cache").is_dir():
        os.environ["MLIR_NN_CACHE_DIR"] = str(args.artifacts / "cache")
        try:
            report["resident"] = resident_check(args.repeat)
        except Exception as e:
            report["resident"] = {"ok": False, "error": "".join(traceback.format_exception(e))}
            print(f"resident trainer: ERROR {e}")
    (args.results / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {args.results / 'gpu_check.json'}")
    checks = [*report["cases"].values(), *([report["resident"]] if "resident" in report else [])]
    return 0 if all(c.get("ok") for c in checks) else 1


def model_case(case: dict, artifact: Artifact, ref: dict) -> dict:
    """The roofline model (labelled as one) of the case's first batch size; prints a table."""
    if artifact.info.get("model") is None:
        print(f"  MODEL: none ({artifact.info.get('model_error')})")
        return {"label": "roofline model, not a measurement", "error": artifact.info.get("model_error")}
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
    if (args.artifacts / "cache").is_dir():
        os.environ["MLIR_NN_CACHE_DIR"] = str(args.artifacts / "cache")
        arch = json.loads((args.artifacts / "cases.json").read_text())["arch"]
        try:
            report["resident"] = dry_resident(arch)
        except Exception as e:
            report["resident"] = {"ok": False, "error": "".join(traceback.format_exception(e))}
        resident = report["resident"]
        print(f"resident trainer: {'payload OK' if resident['ok'] else 'ERROR ' + resident['error']}"
              f" {resident.get('steps', '')}")
    (args.results / "gpu_check.json").write_text(json.dumps(report, indent=1))
    checks = [*report["cases"].values(), *([report["resident"]] if "resident" in report else [])]
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
