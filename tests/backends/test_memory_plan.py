"""The static memory plan: the step's buffers in one workspace per batch size, no malloc.

Numerical checks against the reference use test_cpu.py's float32 tolerances.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys

import numpy as np
import pytest

from mlir_nn.backends.memory_plan import HEADER, MemoryPlan, first_fit, first_fit_linear
from mlir_nn.backends.task_runtime import teams_forked
from mlir_nn.backends.workspace import KEEP, Workspaces
from tests.backends.test_cpu import make_step


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_never_shares_bytes_between_live_buffers(seed):
    rng = np.random.default_rng(seed)
    lives = []
    for _ in range(40):
        first = int(rng.integers(0, 60))
        size = int(rng.choice([4, 16, 48, 64 * int(rng.integers(1, 50))]))
        lives.append((first, first + int(rng.integers(0, 12)), size))
    offsets, total = first_fit(lives)
    for i, (a0, a1, size_a) in enumerate(lives):
        assert offsets[i] % min(64, size_a & -size_a) == 0 and offsets[i] + size_a <= total
        for j, (b0, b1, size_b) in enumerate(lives[:i]):
            if _overlap((a0, a1), (b0, b1)):
                assert offsets[i] + size_a <= offsets[j] or offsets[j] + size_b <= offsets[i], (i, j)
    assert total < sum(size for *_, size in lives)  # buffers with disjoint lives were reused


def test_first_fit_reuses_a_dead_buffer_and_keeps_a_live_one_apart():
    offsets, total = first_fit([(0, 1, 128), (2, 3, 128), (1, 2, 64)])
    assert offsets[0] == offsets[1] == 0 and offsets[2] == 128 and total == 192


def test_first_fit_aligns_each_buffer_to_its_size():
    offsets, total = first_fit([(0, 2, 4), (0, 2, 48), (0, 2, 128), (0, 2, 4)])
    assert offsets[2] == 0 and offsets[1] == 128 and offsets[1] % 16 == 0
    assert sorted([offsets[0], offsets[3]]) == [176, 180] and total == 184


def test_workspace_bytes_scale_with_the_batch():
    plan = MemoryPlan((640, 128, 64), buffers=3, heap_buffers=0)
    assert plan.workspace_bytes(1) == HEADER + 832
    assert plan.workspace_bytes(10) == HEADER + 640 + 1280 + 6400
    assert MemoryPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_an_impossible_workspace_is_a_memory_error_naming_the_step():
    workspaces = Workspaces(MemoryPlan((0, 4096), 1, 0), [((), np.dtype(np.float32))], "step")
    with pytest.raises(MemoryError, match=r"step: a batch of 35184372088832 rows needs a workspace of"):
        workspaces.get(2**45)


def test_outputs_that_cannot_be_allocated_are_a_memory_error_naming_the_step():
    workspace, _ = Workspaces(MemoryPlan((64,), 1, 0), [(("N", 2**20), np.dtype(np.float64))], "step").get(2**30)
    with pytest.raises(MemoryError, match=r"step: its outputs \(1073741824, 1048576\) cannot be allocated"):
        workspace.fresh_outputs()


def test_workspaces_are_kept_per_batch_size_and_reused():
    outputs = [((), np.dtype(np.float32)), (("N", 3), np.dtype(np.float64))]
    workspaces = Workspaces(MemoryPlan((64, 128), 2, 0), outputs, "step")
    first, new = workspaces.get(3)
    assert new and first.buffer.ctypes.data % 64 == 0 and first.buffer.nbytes == HEADER + 64 + 3 * 128
    assert first.outputs == (((), np.dtype(np.float32)), ((3, 3), np.dtype(np.float64)))
    loss, rows = first.fresh_outputs()
    assert loss.shape == () and rows.shape == (3, 3) and rows.dtype == np.float64 and rows.flags.c_contiguous
    again = first.fresh_outputs()
    assert not any(np.shares_memory(a, b) for a, b in zip(again, (loss, rows)))  # every call its own
    assert workspaces.get(3) == (first, False)
    for batch in range(4, 4 + KEEP):
        workspaces.get(batch)
    assert workspaces.get(3)[0] is not first  # the least recently used one was dropped


def allocating_functions(llvm: str) -> set[str]:
    """The functions of the LLVM dialect text ``llvm`` that call malloc, aligned_alloc or free."""
    found, function = set(), None
    for line in llvm.splitlines():
        if (header := re.match(r"\s*llvm\.func\s+(?:\w+\s+)*@([\w.$]+)\(", line)) is not None:
            function = header.group(1)
        elif re.search(r"llvm\.call @(malloc|aligned_alloc|free)\(", line):
            found.add(function)
    return found


def test_the_moons_step_calls_no_malloc_and_reuses_buffers():
    step, _, _ = make_step([2, 32, 32, 16, 1], "sgd", "cpu", 0, lr=0.01)
    x, y = np.ones((10, 2), np.float32), np.ones((10, 1), np.float32)
    compiled = step.lower(x, y)
    llvm = compiled.as_text("llvm")
    # nothing is allocated, and at batch 10 each parallel loop has one iteration: no team is forked
    assert not allocating_functions(llvm)
    before = teams_forked()
    for _ in range(3):
        step(x, y)
    assert teams_forked() == before
    # the only stack slots are the 4-byte MXCSR words of the flush-to-zero bracket (codegen.fp_env)
    slots = re.findall(r"(%\d+) = llvm.alloca", llvm)
    assert all(re.search(rf"llvm.x86.sse.(st|ld)mxcsr\"\({slot}\)", llvm) for slot in slots)
    plan = compiled.executable.kernel.plan
    assert plan.heap_buffers == 0 and plan.buffers > 10
    # every buffer apart would need 32+32+32+16+16+1 floats a row, twice (forward and backward)
    assert 0 < plan.group_bytes[1] < 2 * 4 * (32 + 32 + 32 + 16 + 16 + 1)
    assert plan.group_bytes[1] % 64 == 0


def test_one_step_at_awkward_batch_sizes_in_turn_matches_the_reference():
    """More batch sizes than workspaces kept: each is allocated, dropped and allocated again."""
    sizes = [3, 33, 7, 1]
    fast, fast_model, _ = make_step(sizes, "sgd", "cpu", 4, lr=0.05, momentum=0.5)
    slow, slow_model, _ = make_step(sizes, "sgd", "numpy", 4, lr=0.05, momentum=0.5)
    rng = np.random.default_rng(5)
    for batch in [1, 7, 13, 33, 257, 2, 1, 13, 257, 7] * 2:
        x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
        np.testing.assert_allclose(fast(x, y), slow(x, y), rtol=2e-4, atol=2e-5)
    for p, q in zip(fast_model.parameters(), slow_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4)


def test_page_faults_per_step_stay_near_zero_once_warm():
    step, _, _ = make_step([64, 1024, 10], "sgd", "cpu", 0, lr=1e-3)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((512, 64)).astype(np.float32), rng.standard_normal((512, 10)).astype(np.float32)
    for _ in range(3):
        step(x, y)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step(x, y)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
    # malloc'ed intermediates (~8 MB a step) took ~2,000 minor faults a step before the plan
    assert faults < 20


@pytest.mark.parametrize("batch", [7, 33])
def test_packed_products_take_their_panels_from_the_workspace(batch):
    """The packed products' panels are ceil(batch / tile) * tile rows: bounded by
    batch + tile - 1 rows, they are planned too (they were mallocs, ~4,000 faults a step at
    784-1024-1024-10, batch 512)."""
    sizes = [64, 256, 256, 10]  # 256 * 256 products and more: packed (>= 4096 multiply-adds)
    fast, fast_model, _ = make_step(sizes, "sgd", "cpu", 2, lr=0.01)
    slow, slow_model, _ = make_step(sizes, "sgd", "numpy", 2, lr=0.01)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    compiled = fast.lower(x, y)
    plan = compiled.executable.kernel.plan
    assert plan.heap_buffers == 0 and plan.linear_fixed > 0  # padded panels planned: products were packed
    assert not allocating_functions(compiled.as_text("llvm"))
    for _ in range(3):
        np.testing.assert_allclose(fast(x, y), slow(x, y), rtol=2e-4, atol=2e-5)
    for p, q in zip(fast_model.parameters(), slow_model.parameters()):
        np.testing.assert_allclose(p.data, q.data, atol=2e-4)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        fast(x, y)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20 < 20


def test_first_fit_linear_keeps_live_buffers_apart_at_every_batch():
    rng = np.random.default_rng(0)
    lives = []
    for _ in range(30):
        first = int(rng.integers(0, 40))
        lives.append((first, first + int(rng.integers(0, 8)), 64 * int(rng.integers(0, 9)),
                      64 * int(rng.integers(0, 5))))
    offsets, (rows, fixed) = first_fit_linear(lives)
    for batch in (1, 2, 7, 100):
        spans = [(a * batch + b, (a + r) * batch + b + f) for (a, b), (_, _, r, f) in zip(offsets, lives)]
        assert all(hi <= rows * batch + fixed for _, hi in spans)
        for i, (a0, a1, *_) in enumerate(lives):
            for j, (b0, b1, *_) in enumerate(lives[:i]):
                if _overlap((a0, a1), (b0, b1)) and spans[i][0] < spans[i][1] and spans[j][0] < spans[j][1]:
                    assert spans[i][1] <= spans[j][0] or spans[j][1] <= spans[i][0], (batch, i, j)


OOM_CHILD = """
import resource, sys
import numpy as np
from mlir_nn import jit
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.trainer import train_step

model = MLP(2, [1024, 1])
opt = SGD(model.parameters(), lr=0.01)
step = jit(train_step(model, opt))
rng = np.random.default_rng(0)
step(rng.standard_normal((4, 2)).astype(np.float32), np.ones((4, 1), np.float32))
x, y = rng.standard_normal((8_000_000, 2)).astype(np.float32), np.ones((8_000_000, 1), np.float32)
before = [p.data.copy() for p in model.parameters()]
# about 1 GB of address space beyond what is mapped now: the inputs fit, the step's intermediates do not
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + 2**30, resource.RLIM_INFINITY))
try:
    step(x, y)
    print("no error")
except MemoryError as error:
    print("MemoryError:", error)
print("untouched" if all((p.data == b).all() for p, b in zip(model.parameters(), before)) else "changed")
x, y = x[:4].copy(), y[:4].copy()
print("still works", float(step(x, y)) > 0)
"""


def test_a_batch_too_large_for_memory_is_a_memory_error_with_parameters_untouched():
    """Issue 9 item 1: the compiled step mallocs its intermediates and crashed when malloc failed."""
    result = subprocess.run([sys.executable, "-c", OOM_CHILD], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("MemoryError: step: a batch of 8000000 rows needs a workspace of"), lines
    assert lines[1:] == ["untouched", "still works True"]


def test_convolution_panels_sized_from_im2col_rows_are_planned():
    """A dynamic-batch convolution's packed products size their panels from the im2col rows
    (a collapse of (N, P, Q, ...)): read through that view, they are planned too (they were
    mallocs of tens of MB a call, which made the any-batch VGG step twice the fixed one)."""
    from mlir_nn.backends import get_backend
    from tests.codegen.test_windows import check, conv_graph

    graph = conv_graph("float32", 16, (6, 5), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    plan = get_backend("cpu").compile(graph).kernel.plan
    assert plan.heap_buffers == 0 and plan.linear_fixed > 0  # products packed, their panels in the workspace
    for batch in (3, 1, 8):
        check(graph, batch, seed=batch)



LOOPS = """func.func @step(%x: memref<?x4xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %init = memref.alloc() : memref<4xf32>
  %carried = scf.for %i = %c0 to %c4 step %c1 iter_args(%b = %init) -> (memref<4xf32>) {
    %fresh = memref.alloc() : memref<4xf32>
    %scratch = memref.alloc() : memref<2x4xf32>
    %v = memref.load %b[%i] : memref<4xf32>
    memref.store %v, %scratch[%c1, %i] : memref<2x4xf32>
    memref.store %v, %fresh[%i] : memref<4xf32>
    scf.yield %fresh : memref<4xf32>
  }
  scf.forall (%t, %u) = (1, 0) to (7, 3) step (2, 1) {
    %task = memref.alloc() : memref<16xf32>
    %v = memref.load %carried[%u] : memref<4xf32>
    memref.store %v, %task[%t] : memref<16xf32>
  }
  return
}"""


def test_buffers_of_loops_and_tasks_are_planned_unless_carried_into_the_next_iteration():
    """A loop's scratch buffer takes one slot, a task's buffer one per task (3 x 3 tasks of 64
    bytes, each at its own offset); a buffer yielded to the next iteration stays on the heap."""
    from mlir import ir

    from mlir_nn.backends.memory_plan import plan_memory

    with ir.Context():
        module = ir.Module.parse(LOOPS)
        plan, _ = plan_memory(module, {(0, 0)})
        text = str(module)
    assert plan.heap_buffers == 1 and plan.buffers == 3
    # the tasks' 9 x 64 bytes, init after them (live across both loops), scratch (32 bytes, a
    # cache line; live in the scf.for only) at the tasks' offset
    assert plan.group_bytes == (9 * 64 + 64,)
    assert text.count("memref.alloc()") == 1 and "memref.alloc() : memref<4xf32>" in text.split("scf.forall")[0]
    task = text.split("scf.forall")[1]
    assert "arith.subi" in task and "arith.divui" in task and "memref.view" in task  # (t - 1) / 2 * 3 + u


def test_loop_buffers_of_a_dynamic_batch_product_are_planned_and_correct():
    """The bmm of a dynamic batch loops over its matrices: the transposed copy it makes per
    matrix is a workspace slot, not a malloc per matrix and step."""
    from mlir_nn.backends import get_backend
    from mlir_nn.backends.reference import evaluate
    from tests.codegen.zoo import sequence_zoo

    graph = sequence_zoo("float32")
    executable = get_backend("cpu").compile(graph)
    assert executable.kernel.plan.heap_buffers == 0
    for batch in (1, 7, 13):
        rng = np.random.default_rng(batch)
        inputs = [rng.standard_normal((batch, 4, 6)).astype(np.float32)]
        params = [rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 4, (3, 2)).astype(np.float32),
                  rng.integers(0, 4, (batch, 4, 6)).astype(np.float32)]  # table, rows, picks
        want, _ = evaluate(graph, inputs, [p.copy() for p in params], batch)
        for got, expected in zip(executable.run(inputs, params), want):
            np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_a_cnn_training_step_allocates_nothing_per_step(dynamic_batch):
    """A LeNet-5 step (few-tap and im2col convolutions, their chunked gradients over a static
    batch, BatchNorm2d, max pooling, SGD with momentum): every intermediate is a workspace view
    (no heap buffer), only task frames call malloc, and warm steps take no page faults."""
    import mlir_nn
    from mlir_nn import nn
    from mlir_nn.losses import cross_entropy
    from mlir_nn.optim import SGD
    from mlir_nn.trainer import train_step

    np.random.seed(0)
    model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5),
                          nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 10))
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
    run = mlir_nn.jit(train_step(model, opt, cross_entropy), tiered=False, dynamic_batch=dynamic_batch)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((24, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 24).astype(np.float32)
    compiled = run.lower(x, y)
    assert compiled.executable.kernel.plan.heap_buffers == 0
    assert not allocating_functions(compiled.as_text("llvm"))
    losses = [float(run(x, y).item()) for _ in range(3)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        run(x, y)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10 < 5
    assert losses[2] < losses[0]
