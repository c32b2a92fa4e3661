"""egglog in forked children: a fork pool that builds new models after the parent ran
egglog must finish (it once hung forever), and get the same result as the parent."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import multiprocessing
    import numpy as np
    from mlir_nn import jit
    from mlir_nn.nn import MLP
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    def run(width):
        np.random.seed(width)
        model = MLP(2, [width, 1])
        step = jit(train_step(model, SGD(model.parameters(), lr=0.05)))
        x = np.linspace(-1, 1, 10, dtype=np.float32).reshape(5, 2)
        for _ in range(3):
            loss = step(x, np.ones((5, 1), np.float32))
        return step.lower(x, x[:, :1]).optimize_report.used_optimized, float(loss)

    if __name__ == "__main__":
        first = run(3)  # egglog runs in the parent
        with multiprocessing.get_context("fork").Pool(2) as pool:
            forked = pool.map(run, [5, 6])  # new graphs: egglog is needed in the children
        assert first[0] and all(used for used, _ in forked), (first, forked)
        assert forked == [run(5), run(6)], forked  # same results as in the parent
        print("ok")
""")


def test_fork_pool_after_egglog_ran_completes(tmp_path):
    script = tmp_path / "fork_pool.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
