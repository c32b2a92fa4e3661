"""Steps with collectives in one process: the op, the split at it, the optimizer's view of it.

Outside ``distributed.init()`` an ``allreduce_mean`` reduces over a world of one process, so
a split step must compute exactly what the unsplit graph computes on the reference backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mlir_nn
from mlir_nn import distributed as dist
from mlir_nn.backends.reference import evaluate
from mlir_nn.distributed import comm
from mlir_nn.distributed.sharding import shard_bounds
from mlir_nn.distributed.split import SplitExecutable, split_graph
from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import make_node, verify
from mlir_nn.losses import mse_loss
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD, Adam
from mlir_nn.trainer import Trainer, train_step


def reduced_step(model, opt):
    """What DistributedOptimizer traces, written out (it needs init(); this does not)."""

    def step(x, y):
        pred = model(x)
        loss = mse_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        for p in opt.parameters:
            p._grad = apply("allreduce_mean", p._grad)
        opt.step()
        return loss, pred

    return step


def make(kind):
    model = MLP(3, [5, 2])
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9) if kind == "sgd" else Adam(model.parameters(), lr=0.01)
    return model, opt


def test_allreduce_mean_is_an_ordinary_op():
    x = make_node("input", (), name="x", shape=(4, 3), dtype="float32")
    node = make_node("allreduce_mean", (x,))
    assert (node.shape, node.dtype) == ((4, 3), "float32")
    graph = mlir_nn.ir.Graph((x,), (), (node,))
    verify(graph)
    assert "allreduce_mean(%x) : f32[4, 3]" in str(graph)
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(evaluate(graph, [data], [])[0][0], data)  # one process: itself
    with pytest.raises(NotImplementedError, match="allreduce_mean"):
        apply("allreduce_mean", Tensor(data)).sum().backward()


def test_the_egraph_does_not_fold_the_update_across_the_allreduce():
    model, opt = make("sgd")
    x, y = np.zeros((8, 3), np.float32), np.zeros((8, 2), np.float32)
    plain = mlir_nn.jit(lambda x, y: reduced_step(model, opt)(x, y), backend="numpy")
    optimized = plain.lower(x, y).optimized_graph
    counts = optimized.op_counts()
    assert counts["allreduce_mean"] == 4  # every gradient still exists and is reduced
    assert "gemm" not in counts  # the update was not folded into the weight gradient's product
    assert counts["linear"] == 2  # the forward side was still fused

    without = mlir_nn.jit(train_step(model, SGD(model.parameters(), lr=0.1, momentum=0.9)), backend="numpy")
    assert "gemm" in without.lower(x, y).optimized_graph.op_counts()  # where it does fold without one


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("batch", [1, 7])
def test_split_step_computes_the_whole_graph(kind, backend, batch):
    """Both halves compiled by ``backend`` give the reference's outputs and updates, over
    several steps (momentum and Adam state carried between them)."""
    np.random.seed(3)
    model, opt = make(kind)
    traced = mlir_nn.jit(reduced_step(model, opt), backend="numpy", optimize=False).lower(
        np.zeros((batch, 3), np.float32), np.zeros((batch, 2), np.float32))
    graph, params = traced.graph, [t.data.copy() for t in traced.captured]
    expected = [p.copy() for p in params]
    split = SplitExecutable(graph, backend)
    rng = np.random.default_rng(0)
    index = {p.attr("name"): i for i, p in enumerate(graph.params)}
    for _ in range(3):
        x, y = rng.standard_normal((batch, 3)).astype(np.float32), rng.standard_normal((batch, 2)).astype(np.float32)
        want, updates = evaluate(graph, [x, y], expected, batch)
        for (name, _), value in zip(graph.updates, updates):
            expected[index[name]] = value
        got = split.run([x, y], params)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        for g, w in zip(params, expected):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_split_halves_meet_at_the_allreduce():
    model, opt = make("adam")
    graph = mlir_nn.jit(reduced_step(model, opt), backend="numpy", optimize=False).lower(
        np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32)).graph
    split = split_graph(graph)
    assert "allreduce_mean" not in split.first.op_counts() and "allreduce_mean" not in split.second.op_counts()
    assert split.first.updates == ()  # nothing is written before the second half has read it
    assert len(split.reduced) == len(model.parameters())
    # Adam's step counts need no reduction: computed before, written after
    assert len(split.first_updates) == len(model.parameters())


def test_distributed_optimizer_needs_init(monkeypatch):
    monkeypatch.setattr(comm._state, "comm", None)
    model, opt = make("sgd")
    with pytest.raises(dist.DistributedError, match=r"DistributedOptimizer: call mlir_nn.distributed.init\(\)"):
        dist.DistributedOptimizer(opt)
    with pytest.raises(dist.DistributedError, match="init"):
        Trainer(model, opt, distributed=True)
    with pytest.raises(dist.DistributedError, match="broadcast"):
        dist.broadcast_parameters(model.parameters())
    assert (dist.rank(), dist.size()) == (0, 1)


def test_sample_weight_is_checked_and_restored():
    with pytest.raises(ValueError, match="weight must be >= 0"):
        with dist.sample_weight(-1):
            pass
    with dist.sample_weight(3):
        assert comm.current_weight() == 3.0
    assert comm.current_weight() == 1.0


@given(st.integers(0, 50), st.integers(1, 6))
def test_shards_cover_a_batch_exactly_once(n, size):
    bounds = [shard_bounds(n, r, size) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
