"""Compile the GPU check's cases to .mlirnn artifacts and save NumPy reference results.

Runs where MLIR is installed (no GPU needed): ``make gpu-artifacts`` or
``python benchmarks/make_gpu_artifacts.py benchmarks/artifacts --arch sm_90``.
For each case it writes ``<case>.mlirnn`` and ``<case>.npz`` (initial parameters, and per
batch size the expected outputs and updated parameters from the reference backend).
Like ``mlir_nn.jit``, it compiles the e-graph-optimized graph (fused ``linear``/``gemm``/
``matmul_relu_grad`` kernels); the references come from the traced graph, so the GPU
check covers the optimizer's rewrites too.

It also fills ``<out>/cache`` for the resident-training check (``gpu_cases.trainer_case``):
the optimizer's results and the CUDA artifacts (``mlir_nn.backends.cuda_cache``) of the
Trainer's steps, so that ``Trainer(..., backend="cuda")`` on the GPU machine finds every
step compiled and needs neither egglog nor MLIR there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_cases import (  # noqa: E402
    CASES,
    TRAINER_CASE,
    cnn,
    gpt,
    inputs_for,
    sample_positions,
    trainer_case,
    trainer_steps,
)

from mlir_nn import nn  # noqa: E402
from mlir_nn.backends import cuda_cache  # noqa: E402
from mlir_nn.backends.cuda import build_artifact  # noqa: E402
from mlir_nn.backends.reference import evaluate  # noqa: E402
from mlir_nn.egraph import optimize  # noqa: E402
from mlir_nn.engine import Tensor  # noqa: E402
from mlir_nn.gpu.schedule import STAGE_NAMES, TILING  # noqa: E402
from mlir_nn.ir.shapes import resolve  # noqa: E402
from mlir_nn.jit import trace_step  # noqa: E402
from mlir_nn.losses import mse_loss  # noqa: E402
from mlir_nn.nn import MLP  # noqa: E402
from mlir_nn.nn.transformer import next_token_loss  # noqa: E402
from mlir_nn.optim import SGD, Adam  # noqa: E402
from mlir_nn.runtime.artifact import signature_of  # noqa: E402
from mlir_nn.trainer import train_step  # noqa: E402


def step_function(case: dict) -> tuple:
    np.random.seed(0)
    sizes = case["sizes"]
    if case["kind"] == "mlp_step":
        model = MLP(sizes[0], sizes[1:])
        opt = SGD(model.parameters(), lr=case["lr"])
        return train_step(model, opt), ["x", "y"]
    if case["kind"] == "cnn_step":
        model = cnn(nn, case)
        return train_step(model, SGD(model.parameters(), lr=case["lr"])), ["x", "y"]
    if case["kind"] == "gpt_step":  # GPT.loss's cross-entropy over every position, as train_step's loss
        model = gpt(nn, case)
        return train_step(model, Adam(model.parameters(), lr=case["lr"]), next_token_loss), ["idx", "targets"]
    if case["op"] == "mse":
        return (lambda p, y: mse_loss(p, y)), ["p", "y"]
    w = Tensor(np.random.randn(*sizes) / np.sqrt(sizes[0]), dtype="float32")
    b = Tensor(np.random.randn(sizes[1]), dtype="float32")
    if case["op"] == "matmul":
        return (lambda x: x @ w), ["x"]
    return (lambda x: (x @ w + b).relu()), ["x"]


PRODUCTS = ("matmul", "linear", "gemm", "matmul_relu_grad")
# ops lowered to several kernels in a row (pads, im2col gathers, a product, a transpose): the
# kernels of one node are consecutive, so a run of them is one node (two equal such nodes
# launched back to back would be counted as one)
WINDOW_OPS = ("conv2d", "conv2d_bias", "conv2d_input_grad", "conv2d_weight_grad", "conv2d_weight_update",
              "max_pool2d", "max_pool2d_index", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad",
              "adaptive_avg_pool2d", "adaptive_avg_pool2d_grad", "pad")
CONVOLUTIONS = ("conv2d", "conv2d_bias", "conv2d_input_grad", "conv2d_weight_grad", "conv2d_weight_update")
STAGES = tuple(STAGE_NAMES.values())  # a reduction's two kernels


def node_cost(node, batch: int) -> tuple[float, float]:
    """(FLOPs, compulsory global-memory bytes) of one node at ``batch``: the performance model's input."""
    numel = [float(np.prod(resolve(n.shape, batch))) for n in (*node.inputs, node)]
    itemsize = np.dtype(node.dtype).itemsize
    if node.op in PRODUCTS:
        k = np.sqrt(numel[0] * numel[1] / numel[-1])  # (M*K) * (K*N) / (M*N)
        flops = 2 * numel[-1] * k + 2 * numel[-1]  # the product and its epilogue
    elif node.op in CONVOLUTIONS:  # each element of the output (the output gradient) meets one weight per window
        outputs, weight = {"conv2d": (numel[-1], node.inputs[1].shape),
                           "conv2d_bias": (numel[-1], node.inputs[1].shape),
                           "conv2d_input_grad": (numel[0], node.inputs[1].shape),
                           "conv2d_weight_grad": (numel[1], node.shape),
                           "conv2d_weight_update": (numel[1], node.shape)}[node.op]
        macs = outputs * np.prod(weight[1:])
        flops = 2 * float(macs)
    else:
        flops = max(numel)
    return flops, itemsize * sum(numel)


def node_costs(graph, kernels: list[str]) -> list[dict]:
    """Kernels (launch order, named ``<func>_kNN_<op>``) grouped by the Graph node they compute, with its
    FLOPs and bytes as ``[a, b]`` for ``a * batch + b`` (both are linear in the batch size)."""
    nodes = iter(n for n in graph.compute_nodes)
    model: list[dict] = []
    staged = False
    pending: list[str] = []  # initializers (``<op>_init``) of the next node
    for kernel in kernels:
        op = re.search(r"_k\d+_(\w+)$", kernel).group(1)
        tiling = TILING.search(op)
        op = TILING.sub("", op)
        base = next((op[:-len(s)] for s in STAGES if op.endswith(s)), op)
        if op.endswith("_init"):
            pending.append(kernel)
            continue
        same = bool(model) and base == model[-1]["op"]
        tilings = {m.group(0) for k in model[-1]["kernels"] if (m := TILING.search(k))} if model else set()
        other_tiling = tiling is not None and same and bool(tilings) and tiling.group(0) not in tilings
        if other_tiling or (same and staged and not op.endswith(STAGES[0])) or (same and base in WINDOW_OPS):
            model[-1]["kernels"].append(kernel)  # another tiling, a reduction's second kernel or its 0-d epilogue
        else:
            node = next((n for n in nodes if n.op == base), None)
            if node is None:
                raise ValueError(f"kernel {kernel}: no {base} node left in the graph to attribute it to")
            (f1, b1), (f2, b2) = node_cost(node, 1), node_cost(node, 2)
            model.append({"op": base, "kernels": [*pending, kernel], "flops": [f2 - f1, 2 * f1 - f2],
                          "bytes": [b2 - b1, 2 * b1 - b2]})
            pending = []
        staged = op != base
    return model


def build_case(name: str, case: dict, out: Path, arch: str) -> dict:
    fn, names = step_function(case)
    first = inputs_for(case, case["batches"][0])
    graph, captured, _ = trace_step(fn, first, names, dynamic_batch=not case.get("static", False))
    start = time.perf_counter()
    optimized, report = optimize(graph, batch_estimate=case["batches"][0])
    if signature_of(optimized) != signature_of(graph):
        raise RuntimeError(f"{name}: the optimized graph changed the step's signature")
    artifact = build_artifact(optimized, arch)
    launched = [r["kernel"] for r in artifact.plan["program"] if r["op"] == "gpu.launch_func"]
    try:
        artifact.info["model"] = node_costs(optimized, launched)
    except ValueError as error:  # kernels this model cannot attribute to nodes (the GPT step's fused ones)
        artifact.info["model"], artifact.info["model_error"] = None, str(error)
    artifact.info["egraph"] = {"kernels_before": report.kernels_before, "kernels_after": report.kernels_after,
                               "ok": report.error is None}
    seconds = time.perf_counter() - start
    artifact.write(out / f"{name}.mlirnn")
    params = [t.data.copy() for t in captured]
    ref: dict[str, np.ndarray] = {f"param{i}": p for i, p in enumerate(params)}
    for batch in case["batches"]:
        inputs = inputs_for(case, batch)
        outputs, updates = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for i, o in enumerate(outputs):
            ref[f"b{batch}_out{i}"] = np.asarray(o)
        for i, u in enumerate(updates):
            ref[f"b{batch}_update{i}"] = np.asarray(u).ravel()[sample_positions(np.size(u))]
    np.savez_compressed(out / f"{name}.npz", **ref)
    return {"kernels": artifact.info["kernels"], "compile_s": round(seconds, 2),
            "artifact_bytes": (out / f"{name}.mlirnn").stat().st_size}


def build_trainer_case(out: Path, arch: str) -> dict:
    """Train the Trainer case one epoch on the reference backend (tracing and optimizing its
    steps into ``out/cache``), then compile each optimized step into the CUDA cache there."""
    shutil.rmtree(out / "cache", ignore_errors=True)  # only this tree's entries travel
    os.environ["MLIR_NN_CACHE_DIR"] = str(out / "cache")
    trainer, _, _, (X, y, X_val, y_val) = trainer_case("numpy")
    random.seed(0)
    start = time.perf_counter()
    trainer.train(X, y, n_epochs=1, batch_size=TRAINER_CASE["batch_size"], validation_data=(X_val, y_val),
                  verbose=False)
    kernels = []
    for compiled in trainer_steps(trainer):
        artifact = build_artifact(compiled.optimized_graph, arch)
        if cuda_cache.store(artifact) is None:
            raise OSError(f"cannot write the CUDA cache in {out / 'cache'}")
        kernels.append(artifact.info["kernels"])
    return {"kernels": kernels, "compile_s": round(time.perf_counter() - start, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--no-trainer", action="store_true", help="skip the resident-training case")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {name: build_case(name, CASES[name], args.out, args.arch) for name in args.cases}
    trainer = None if args.no_trainer else build_trainer_case(args.out, args.arch)
    (args.out / "cases.json").write_text(json.dumps({"arch": args.arch, "cases": summary, "trainer": trainer},
                                                    indent=1))
    for name, s in summary.items():
        print(f"{name}: {s['kernels']} kernels, compiled in {s['compile_s']} s, {s['artifact_bytes']} bytes")
    if trainer:
        print(f"trainer case: steps of {trainer['kernels']} kernels, traced and compiled in {trainer['compile_s']} s")


if __name__ == "__main__":
    main()
