"""``mlir-nn compile --target cuda``: write the artifact or print a CUDA stage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mlir_nn.ir import Graph


def emit_cuda(graph: Graph, args: argparse.Namespace) -> int:
    """Compile ``graph`` for ``args.arch`` and write what ``args.emit`` asks for."""
    from mlir_nn.backends.cuda import artifact_of, compile_graph
    from mlir_nn.gpu import ARCH_FEATURES

    if args.arch not in ARCH_FEATURES:
        print(f"mlir-nn: error: unknown --arch {args.arch}; expected one of {', '.join(ARCH_FEATURES)}",
              file=sys.stderr)
        return 2
    if args.simt_check and not args.emit and not args.output:
        return simt_check(graph, args)
    emit = args.emit or "artifact"
    if emit in ("artifact", "cubin") and not args.output:
        what = "the .mlirnn artifact" if emit == "artifact" else "cubins (a directory)"
        print(f"mlir-nn: error: --target cuda writes {what}; give -o", file=sys.stderr)
        return 2
    program = compile_graph(graph, (args.arch,), cubin=emit in ("artifact", "cubin"))
    if emit == "artifact":
        artifact_of(graph, program, args.arch).write(args.output)
    elif emit == "cubin":
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        for name, blob in program.cubin[args.arch].items():
            (out / f"{name}.cubin").write_bytes(blob)
    else:
        # one kernel module per step: its PTX is one file that ptxas accepts as is
        text = program.gpu_text if emit == "gpu" else "".join(program.ptx[args.arch].values())
        if args.output:
            Path(args.output).write_text(text)
        else:
            sys.stdout.write(text)
    if args.stats:
        seconds = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in program.timings.items())
        print(f"cuda: {program.kernel_count} kernels, schedules {program.schedules}; {seconds}", file=sys.stderr)
    return simt_check(graph, args, program) if args.simt_check else 0


def simt_check(graph: Graph, args: argparse.Namespace, program: Any = None) -> int:
    """Run the step's kernels at ``args.batch`` on the SIMT interpreter; print one line, problems on stderr."""
    from mlir_nn.gpu.simt import SimtError
    from mlir_nn.gpu.simt_check import check_graph

    try:
        result = check_graph(graph, args.batch, args.seed, program)
    except SimtError as error:
        print(f"mlir-nn: error: {error}", file=sys.stderr)
        return 1
    print(result.line)
    for problem in result.problems:
        print(f"simt: {problem}", file=sys.stderr)
    return 0 if result.ok else 1
