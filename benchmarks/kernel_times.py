"""Wall time of each kernel of a split CPU step, by core placement (near, far, mixed).

A split step (``kernel_split``) calls one function per kernel. Here the step's text is
instrumented as it is split: a call of ``mlirnn_tick`` (``kernel_times.c``: a time stamp
into an array) right before and after each kernel call, so each kernel's wall time on the
calling thread (its tasks on the other threads included) comes from the step's own calls
on its real buffers, at ~40 ns a call and with both threads free (``perf`` takes one of
the two cores). Steps run in slices with the one-way time of a cache line between the
cores (``core_latency``) measured before and after each slice, which gives its placement.
Per placement: the median of each kernel and of the step; with both placements seen, the
kernels sorted by how much slower they run far. Each kernel is listed with the shapes of the buffers
it is called with (its name is a hash of its text). The compile cache is a fresh temporary
folder (an instrumented step must not be cached for others).

``--twice`` calls each kernel twice in a row: the second call finds its inputs where the
first left them (in the cache of the core that read them), so far - near of the first call
less that of the second is what crossing the data from the kernels before costs. The step's
results are then wrong (a kernel that adds into a buffer adds twice): for timing only.

    python benchmarks/kernel_times.py [--sizes 784-1024-1024-10] [--batch 512] [--optimizer sgd]
        [--dtype float32] [--seconds 60] [--twice]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STEPS_PER_SLICE = 15
_CALL = re.compile(r"^(\s*)(?:func\.)?call @(\w+)\(")
_TICK = "func.call @mlirnn_tick() : () -> ()"
_BUFFER = re.compile(r"memref<((?:[?\d]+x)*)[a-z]+\d*[,>]")


def _kernel_called(line: str) -> tuple[str, str] | None:
    """(indent, kernel name less the declaration's suffix) of a line of a split step that calls a function."""
    match = _CALL.match(line)
    return (match.group(1), match.group(2).rsplit("_", 1)[0]) if match else None


def instrument(step: str, kernels: set[str], twice: bool = False) -> tuple[str, list[str]]:
    """``step`` (a split step's text) with a tick before and after each call of a kernel
    (its name, less the declaration's suffix, in ``kernels``), and the kernels in call order.
    ``twice``: each call is made twice in a row (the second named ``<kernel>-again``)."""
    lines, order = ["func.func private @mlirnn_tick()"], []
    for line in step.splitlines():
        indent, kernel = _kernel_called(line) or ("", None)
        if kernel in kernels:
            lines += [indent + _TICK, line, indent + _TICK] * (2 if twice else 1)
            order += [kernel, kernel + "-again"] if twice else [kernel]
        else:
            lines.append(line)
    return "\n".join(lines), order


def buffers(step: str, kernels: set[str]) -> dict[str, str]:
    """The shapes of the buffers each kernel of ``kernels`` is called with in ``step`` (a split
    step's text), e.g. ``?x12x784 ?x784x12`` for a packing of 784-wide rows into 12-row panels:
    what tells the kernels apart in the report (their names are hashes of their text)."""
    found: dict[str, str] = {}
    for line in step.splitlines():
        kernel = (_kernel_called(line) or ("", None))[1]
        if kernel in kernels and kernel not in found:
            found[kernel] = " ".join(shape.rstrip("x") or "scalar" for shape in _BUFFER.findall(line))
    return found


def measure(sizes: tuple[int, ...], batch: int, seconds: float, twice: bool = False, optimizer: str = "sgd",
            dtype: str = "float32") -> tuple[list[str], dict[str, list[np.ndarray]], dict[str, str]]:
    """The kernels in call order, per placement one row per step: each kernel's time (ns), then
    the step's from its first tick to its last (``twice``: see ``instrument``), and each
    kernel's ``buffers``."""
    from benchmarks.core_latency import one_way_ns
    from benchmarks.grid import Point, data, mlir_nn_step, placement
    from mlir_nn.backends import kernel_split
    from mlir_nn.backends.c_build import CBuild

    build = CBuild(Path(__file__).with_name("kernel_times.c"), "kernel-times", "libkernel_times.so",
                   "kernel tick recorder", lambda: [], lambda: [])
    library = build.load_global()  # the step's tick calls bind to it
    ticks = (ctypes.c_int64 * 65536).in_dll(library, "mlirnn_ticks")
    count = ctypes.c_int64.in_dll(library, "mlirnn_tick_count")
    order: list[str] = []
    shapes: dict[str, str] = {}
    split_step = kernel_split.split_step

    def split_instrumented(module: object) -> kernel_split.Split:
        split = split_step(module)
        shapes.update(buffers(split.step, set(split.kernels)))
        split.step, calls = instrument(split.step, set(split.kernels), twice)
        order.extend(calls)
        return split

    kernel_split.split_step = split_instrumented
    point = Point(sizes, batch, optimizer, dtype)
    step, (x, y) = mlir_nn_step(point), data(point)
    for _ in range(3):
        step(x, y)
    if not order:
        raise RuntimeError("the step was not split into kernels: nothing to time")
    rows: dict[str, list[np.ndarray]] = {}
    end = time.monotonic() + seconds
    while True:
        before, taken = one_way_ns(rounds=500, repeats=3), []
        for _ in range(STEPS_PER_SLICE):
            count.value = 0
            step(x, y)
            stamps = np.array(ticks[:count.value])
            if len(stamps) != 2 * len(order):
                raise RuntimeError(f"{len(stamps)} ticks for {len(order)} kernel calls")
            taken.append(np.append(stamps[1::2] - stamps[0::2], stamps[-1] - stamps[0]))
        rows.setdefault(placement([before, one_way_ns(rounds=500, repeats=3)]), []).extend(taken)
        if time.monotonic() > end:
            return order, rows, shapes


def report(order: list[str], rows: dict[str, list[np.ndarray]], top: int, shapes: dict[str, str]) -> list[str]:
    medians = {side: np.median(np.array(taken), axis=0) / 1e3 for side, taken in rows.items()}
    lines = [f"{side}: {len(rows[side])} steps, {m[-1]:.1f} us first to last tick, kernels {m[:-1].sum():.1f} us"
             for side, m in medians.items()]
    if "near" in medians and "far" in medians:
        near, far = medians["near"][:-1], medians["far"][:-1]
        lines.append(f"{'call':>4} {'kernel':<32} {'near us':>9} {'far us':>9} {'far - near':>10}  buffers")
        for i in np.argsort(near - far)[:top]:
            lines.append(f"{i:4d} {order[i]:<32} {near[i]:9.1f} {far[i]:9.1f} {far[i] - near[i]:+10.1f}  "
                         f"{shapes.get(order[i].removesuffix('-again'), '')}")
    else:
        side, m = next(iter(medians.items()))
        lines.append(f"{'call':>4} {'kernel':<32} {side + ' us':>9}  buffers")
        lines += [f"{i:4d} {order[i]:<32} {m[i]:9.1f}  {shapes.get(order[i].removesuffix('-again'), '')}"
                  for i in np.argsort(-m[:-1])[:top]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="784-1024-1024-10")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    parser.add_argument("--twice", action="store_true",
                        help="call each kernel twice in a row (the step's results are then wrong)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MLIR_NN_CACHE_DIR"] = cache
        order, rows, shapes = measure(tuple(int(n) for n in args.sizes.split("-")), args.batch, args.seconds,
                                      args.twice, args.optimizer, args.dtype)
    print("\n".join(report(order, rows, args.top, shapes)))


if __name__ == "__main__":
    main()
