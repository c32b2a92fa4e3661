"""Register-tiled products: the tiling rule, decided while compiling or per call by the host."""

import pytest

from mlir_nn.backends.cuda import compile_graph
from mlir_nn.gpu.matmul import LARGE, SMALL, SMS, tiling_for
from mlir_nn.runtime.plan import Launch, bind
from tests.gpu.test_graph_steps import traced


@pytest.mark.parametrize("rows,cols,want", [(12 * 128, 11 * 128, LARGE), (12 * 128 - 127, 11 * 128 - 127, LARGE),
                                            (12 * 128, 10 * 128, SMALL), (784, 1024, SMALL), (1, 10 ** 6, LARGE)])
def test_large_tiles_when_every_sm_gets_a_block(rows, cols, want):
    assert tiling_for(rows, cols) == want
    assert (-(-rows // 128) * -(-cols // 128) >= SMS) == (want == LARGE)


def test_the_host_picks_the_tiling_per_batch():
    """A product over the batch has both kernels; the plan launches the 128 x 128 one from 132 row tiles on."""
    graph = traced("20,48,8", 7, optimized=True)
    program = compile_graph(graph, (), cubin=False)

    def launched(batch):
        shapes = [tuple(batch if d == "N" else d for d in n.shape) for n in graph.inputs + graph.params]
        return [a for a in bind(program.plan, shapes).actions if isinstance(a, Launch)]

    small, large = launched(SMS * 128 - 128), launched(SMS * 128 - 127)
    forward = [a for a in small if a.kernel.endswith("_k01_linear_tile64")]
    assert len(forward) == 1 and forward[0].grid[:2] == (SMS * 2 - 2, 1)
    assert not any(a.kernel.endswith("_tile128") for a in small)
    big = [a for a in large if a.kernel.endswith("_k00_linear_tile128")]
    assert len(big) == 1 and big[0].grid[:2] == (SMS, 1)
    assert not any(a.kernel.endswith("_linear_tile64") for a in large)
    assert len(small) == len(large)  # one kernel per product either way
    # the weight gradients (20 x 48, 48 x 8) have static shapes: one kernel, the small tiling
    assert sum(a.kernel.endswith("_gemm_tile64") for a in large) == 2
