"""A child process for tests/jit/test_pipeline.py: a SIGINT lands at the Nth Python call made
in files whose path contains KEY while a step compiles cold; then the process compiles again.

Usage: python -m tests.jit.interrupted_compile KEY N. Prints "interrupted" or "finished",
then the second compile's loss."""

import signal
import sys

import numpy as np

import mlir_nn
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step


def main(key: str, nth: int) -> None:
    calls = 0

    def interrupt_at_nth_call(frame, event, arg):
        nonlocal calls
        if event == "call" and key in frame.f_code.co_filename:
            calls += 1
            if calls == nth:
                signal.raise_signal(signal.SIGINT)

    np.random.seed(0)
    model = MLP(2, [4, 1])
    x, y = np.ones((3, 2), np.float32), np.ones((3, 1), np.float32)
    step = mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1)), backend="cpu", tiered=False)
    sys.setprofile(interrupt_at_nth_call)
    try:
        step(x, y)
        outcome = "finished"
    except KeyboardInterrupt:
        outcome = "interrupted"
    finally:
        sys.setprofile(None)
    again = mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1)), backend="cpu", tiered=False)
    print(outcome, float(again(x, y)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
