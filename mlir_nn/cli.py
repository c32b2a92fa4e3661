"""The ``mlir-nn`` command line: compile an MLP training step and print any stage."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

STAGES = ("tensor", "optimized", "linalg", "llvm")
CUDA_STAGES = ("gpu", "ptx", "cubin")
SEED_MAX = 2**32 - 1  # numpy's legacy seeding takes [0, 2**32)
TRACE_ROWS = 8  # rows of the example batch traced (the batch is dynamic; --batch is the size estimate)


class UsageError(Exception):
    """A bad argument found after parsing: one line on stderr naming it, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """Argument errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_mlp(text: str) -> list[int]:
    """'2,32,32,16,1' -> [2, 32, 32, 16, 1]: at least an input and an output width."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mlp expects comma-separated positive integers, got {text!r}") from None
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"--mlp expects at least two positive widths (inputs,...,outputs), got {text!r}"
        )
    return sizes


def _number(text: str, parse: Callable[[str], float], kind: str, valid: Callable[[float], bool],
            expected: str) -> float:
    """``parse(text)`` when it is ``valid``; else argparse's error (one line, exit status 2)."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
    if not valid(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text if parse is float else value}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, "a positive integer", lambda v: v >= 1, "a positive integer")


def non_negative_float(text: str) -> float:
    return _number(text, float, "a number", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def seed_value(text: str) -> int:
    return _number(text, int, "an integer", lambda v: 0 <= v <= SEED_MAX, f"an integer in [0, {SEED_MAX}]")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlir-nn", description="Compile tensor training steps through MLIR.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="trace an MLP training step and print a compilation stage",
                       description="Trace one training step (forward, loss, backward, optimizer update) "
                                   "of an MLP and print the requested stage.")
    c.add_argument("--mlp", type=parse_mlp, required=True,
                   help="layer widths, input first, e.g. 2,32,32,16,1 (hidden layers use ReLU)")
    c.add_argument("--batch", type=positive_int, default=100, help="mini-batch size to trace with (default 100)")
    c.add_argument("--loss", choices=("mse",), default="mse", help="loss function (default mse)")
    c.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="optimizer (default sgd)")
    c.add_argument("--lr", type=non_negative_float, default=0.005, help="learning rate (default 0.005)")
    c.add_argument("--momentum", type=non_negative_float, default=0.0, help="SGD momentum (default 0)")
    c.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="L2 weight decay (default 0)")
    c.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="element type")
    c.add_argument("--emit", choices=STAGES + CUDA_STAGES, default=None,
                   help="stage to print: tensor (the traced IR, the default), optimized (after the e-graph "
                        "optimizer), linalg (MLIR on tensors), llvm (MLIR LLVM dialect after the CPU pass "
                        "pipeline); for CUDA: gpu (kernels after outlining), ptx, cubin (one file per kernel "
                        "module into the -o directory)")
    c.add_argument("--target", choices=("cpu", "cuda"), default=None,
                   help="code to generate (default cpu, or cuda for --emit gpu, ptx or cubin); with cuda and no "
                        "--emit, -o FILE gets the .mlirnn artifact")
    c.add_argument("--arch", default=None, help="CUDA arch for --target cuda: sm_80, sm_86, sm_89 or sm_90 "
                                                   "(default sm_90)")
    c.add_argument("--simt-check", action="store_true",
                   help="with --target cuda: run every kernel at --batch on the SIMT interpreter (CPU) against the "
                        "NumPy reference; prints 'simt: N kernels, R races, max rel err E', exit 1 on a problem")
    c.add_argument("--pipeline", metavar="FILE",
                   help="CPU pass pipeline file (one pass per line) instead of the shipped one")
    c.add_argument("-o", "--output", metavar="FILE", help="write the stage to FILE instead of stdout")
    c.add_argument("--stats", action="store_true", help="print node counts and time per stage to stderr")
    c.add_argument("--no-egraph", action="store_true", help="skip the e-graph optimizer")
    c.add_argument("--seed", type=seed_value, default=0, help="random seed for the weights (default 0)")
    cal = sub.add_parser("calibrate", help="measure the CPU product schedules' rates on this machine",
                         description="Time a few small products compiled in each CPU schedule and print the "
                                     "rates that product schedules are chosen by; with --store, keep them for this "
                                     "CPU in the cache folder (compiled steps are then planned with them; their "
                                     "cache keys change).")
    cal.add_argument("--budget", type=non_negative_float, default=0.3,
                     help="seconds of timing per measured product (default 0.3)")
    cal.add_argument("--store", action="store_true",
                     help="make the measured table this CPU's (default: print it only; measured while other "
                          "processes use the cores, threads look more expensive than they are)")
    return parser


def physical_memory() -> int:
    """Bytes of RAM on this machine (a bound nothing we allocate can exceed)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_sizes(args: argparse.Namespace) -> None:
    """Refuse --mlp and --batch whose weights or example batch cannot fit in memory."""
    itemsize = np.dtype(args.dtype).itemsize
    sizes = args.mlp
    weights = sum((sizes[i] + 1) * sizes[i + 1] for i in range(len(sizes) - 1)) * itemsize
    batch = args.batch * (sizes[0] + sizes[-1]) * itemsize
    limit = physical_memory()
    for option, value, needed in (("--mlp", ",".join(map(str, sizes)), weights), ("--batch", args.batch, batch)):
        if needed > limit:
            raise UsageError(f"argument {option}: {value} needs {needed / 2**30:.1f} GiB of {args.dtype} "
                             f"arrays; this machine has {limit / 2**30:.1f} GiB")


def check_output(args: argparse.Namespace, cubin: bool) -> None:
    """Refuse an -o that cannot be written before any work is done."""
    if args.output is None:
        return
    if not args.output:
        raise UsageError("argument -o/--output: empty file name (leave -o out to write to stdout)")
    path = Path(args.output)
    if cubin:
        if path.exists() and not path.is_dir():
            raise UsageError(f"argument -o/--output: {path} exists and is not a directory "
                             "(--emit cubin writes one file per kernel module into a directory)")
        return
    if path.is_dir():
        raise UsageError(f"argument -o/--output: {path} is a directory; expected a file name")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"argument -o/--output: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) and not (path.exists() and os.access(path, os.W_OK)):
        raise UsageError(f"argument -o/--output: cannot write into {parent}")


def build_step(args: argparse.Namespace, rows: int | None = None) -> tuple[Callable[..., Any], np.ndarray, np.ndarray]:
    """The MLP training step described by the options, with example inputs of ``rows`` rows
    (default ``--batch``; tracing needs only their shapes past the batch)."""
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD, Adam
    from mlir_nn.trainer import train_step

    np.random.seed(args.seed)
    model = MLP(args.mlp[0], args.mlp[1:], dtype=args.dtype)
    if args.optimizer == "sgd":
        opt = SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    else:
        opt = Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    step = train_step(model, opt)
    rows = args.batch if rows is None else rows
    x = np.random.randn(rows, args.mlp[0]).astype(args.dtype)
    y = np.random.randn(rows, args.mlp[-1]).astype(args.dtype)
    return step, x, y


def stage_text(graph: Any, args: argparse.Namespace, timings: dict[str, float]) -> str:
    """The text of stage ``args.emit`` for the (optimized) graph; adds each stage's time to ``timings``."""
    if args.emit == "optimized":
        return str(graph)
    if args.emit == "linalg":
        from mlir_nn.codegen import emit_linalg

        start = time.perf_counter()
        text = str(emit_linalg(graph))
        timings["codegen"] = time.perf_counter() - start
        return text
    from mlir_nn.backends.cpu import lower
    from mlir_nn.backends.lowering import LoweringError, check_lowered_to_llvm

    pipeline = load_cli_pipeline(args)
    try:
        module, stages, stage_times = lower(graph, pipeline)
        check_lowered_to_llvm(module, pipeline)  # a partial pipeline is an error, not LLVM IR
    except LoweringError as error:
        if args.pipeline:
            raise UsageError(f"argument --pipeline: {error}") from None
        raise
    timings.update(stage_times)
    return stages["llvm"]


def load_cli_pipeline(args: argparse.Namespace) -> Any:
    """The --pipeline file (or the shipped cpu pipeline); a bad file is a UsageError."""
    from mlir_nn.support.pipelines import load_pipeline

    try:
        return load_pipeline(args.pipeline or "cpu")
    except (OSError, ValueError) as error:
        if args.pipeline:
            raise UsageError(f"argument --pipeline: {error}") from None
        raise


def check_target(args: argparse.Namespace, emit: str | None) -> bool:
    """Whether CUDA code is asked for; options that would be ignored for that target are errors."""
    cuda = args.target == "cuda" or (args.target is None and emit in CUDA_STAGES)
    if args.target == "cpu" and emit in CUDA_STAGES:
        raise UsageError(f"argument --emit: {emit} is a CUDA stage; use --target cuda (or --emit "
                         f"{', '.join(STAGES)} for the cpu)")
    if cuda and emit in ("linalg", "llvm"):
        raise UsageError(f"argument --emit: {emit} is a CPU stage; with --target cuda use gpu, ptx or cubin "
                         "(tensor and optimized are the same for both targets)")
    if cuda and args.pipeline:
        raise UsageError("argument --pipeline: the CPU pass pipeline is not used with --target cuda")
    if not cuda and args.simt_check:
        raise UsageError("argument --simt-check: checks CUDA kernels; needs --target cuda")
    if not cuda and args.arch is not None:
        raise UsageError(f"argument --arch: {args.arch} is a CUDA arch; needs --target cuda")
    if args.optimizer != "sgd" and args.momentum:
        raise UsageError(f"argument --momentum: SGD's momentum; --optimizer {args.optimizer} has none")
    args.arch = args.arch or "sm_90"
    if cuda and emit in ("tensor", "optimized"):
        return False  # the graph stages come before any target's code
    if cuda:
        from mlir_nn.gpu import ARCH_FEATURES

        if args.arch not in ARCH_FEATURES:
            raise UsageError(f"argument --arch: unknown arch {args.arch}; expected one of {', '.join(ARCH_FEATURES)}")
    return cuda


def check_environment(emit: str | None) -> None:
    """MLIR_NN_OPT_LEVEL is read when the CPU backend loads: check it before any work."""
    if emit == "llvm":
        try:
            from mlir_nn.backends import native  # noqa: F401 - importing validates the variable
        except ValueError as error:
            raise UsageError(str(error)) from None


def write_output(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as error:
        raise UsageError(f"argument -o/--output: cannot write {path}: {error.strerror or error}") from None


def print_stats(args: argparse.Namespace, graph: Any, report: Any, timings: dict[str, float]) -> None:
    """With --stats: node counts, the optimizer's report and time per stage, on stderr."""
    if not args.stats:
        return
    counts = ", ".join(f"{op}={n}" for op, n in sorted(graph.op_counts().items()))
    print(f"tensor IR: {len(graph.compute_nodes)} compute nodes ({counts})", file=sys.stderr)
    if report is not None:
        print(report, file=sys.stderr)
    print("time: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in timings.items()), file=sys.stderr)


def print_schedules(args: argparse.Namespace, graph: Any) -> None:
    """With --stats on the cpu target: the schedule of each matrix product and why, on stderr."""
    if not args.stats:
        return
    from mlir_nn.codegen import emit_linalg
    from mlir_nn.codegen.schedule_report import product_schedules
    from mlir_nn.support import schedule_rates

    schedules = product_schedules(emit_linalg(graph, wide_sums=True), batch_rows=graph.batch_rows)
    rates = schedule_rates.active()
    print(f"products: {len(schedules)} (priced by the {rates.source} table of rates {rates.digest()[:12]})",
          file=sys.stderr)
    for schedule in schedules:
        print(f"  {schedule}", file=sys.stderr)


def cmd_compile(args: argparse.Namespace) -> int:
    from mlir_nn.jit import trace_step

    cuda = check_target(args, args.emit)
    emit = args.emit or ("tensor" if not cuda else None)
    check_output(args, cubin=emit == "cubin")
    check_sizes(args)
    check_environment(emit)
    if args.pipeline and not cuda:
        load_cli_pipeline(args)
    try:
        step, x, y = build_step(args, rows=min(args.batch, TRACE_ROWS))
    except MemoryError:
        raise UsageError(f"arguments --mlp/--batch: not enough memory for an MLP {args.mlp} at batch {args.batch}") \
            from None
    start = time.perf_counter()
    graph, _, _ = trace_step(step, [x, y], ["x", "y"])
    timings = {"trace": time.perf_counter() - start}
    optimized, report = graph, None
    if not args.no_egraph and (emit != "tensor" or args.stats):
        from mlir_nn.egraph import optimize

        optimized, report = optimize(graph, batch_estimate=args.batch)
        timings["egraph"] = report.seconds
    if cuda:
        from mlir_nn.gpu.cli import emit_cuda

        print_stats(args, graph, report, timings)
        try:
            return emit_cuda(optimized, args)
        except OSError as error:
            raise UsageError(f"argument -o/--output: cannot write {args.output}: {error.strerror or error}") \
                from None
    try:
        text = str(graph) if emit == "tensor" else stage_text(optimized, args, timings)
    except (RuntimeError, ValueError, OSError) as error:
        print(f"mlir-nn: error: {error}", file=sys.stderr)
        return 1
    if args.output:
        write_output(args.output, text)
    else:
        sys.stdout.write(text)
    print_stats(args, graph, report, timings)
    print_schedules(args, optimized)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from mlir_nn.backends.schedule_calibration import measure
    from mlir_nn.support import schedule_rates

    rates = measure(args.budget, report=print)
    print(rates.to_json())
    if args.store:
        print(f"stored in {schedule_rates.store(rates)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return cmd_calibrate(args) if args.command == "calibrate" else cmd_compile(args)
    except UsageError as error:
        print(f"mlir-nn: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
