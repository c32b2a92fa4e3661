"""Large zeroed buffers on small pages (``mlir_nn.support.pages``), where optimizer state and
workspaces come from."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest

from mlir_nn.backends.workspace import MemoryPlan, Workspaces
from mlir_nn.engine import Tensor
from mlir_nn.optim import zeros_like
from mlir_nn.support.pages import HUGE_PAGES_FROM, wait_populated, zeroed_bytes, zeros

SMAPS = Path("/proc/self/smaps")
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_page_eligible(array: np.ndarray) -> bool:
    """Whether the kernel may back any of the mappings that hold ``array`` with transparent huge
    pages (numpy's ``madvise`` splits off the page-aligned middle of a buffer as a mapping of its own)."""
    first = array.__array_interface__["data"][0]
    last = first + array.nbytes
    overlapping, eligible = False, []
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            overlapping = start < last and first < end
        elif overlapping and head == "THPeligible:":
            eligible.append(line.split()[1] == "1")
    assert eligible, f"no mapping holds {first:#x}-{last:#x}"
    return any(eligible)


needs_madvise_mode = pytest.mark.skipif(
    not THP_MODE.exists() or "[madvise]" not in THP_MODE.read_text(),
    reason="huge pages here are not only for mappings that ask for them (mode madvise)")


@pytest.mark.parametrize("nbytes", [0, 1, 4095, HUGE_PAGES_FROM - 1, HUGE_PAGES_FROM, 3 * HUGE_PAGES_FROM + 17])
def test_zeroed_bytes_are_writable_zeros(nbytes):
    buffer = zeroed_bytes(nbytes)
    assert buffer.dtype == np.uint8 and buffer.shape == (nbytes,) and not buffer.any()
    buffer[:] = 7
    assert (buffer == 7).all()


@pytest.mark.parametrize("shape,dtype", [((3, 5), np.float32), ((1024, 1025), np.float32), ((0, 4096), np.float64),
                                         ((700, 1000), np.float64), ((2**21,), np.int32)])
def test_zeros_match_numpy(shape, dtype):
    array = zeros(shape, dtype)
    np.testing.assert_array_equal(array, np.zeros(shape, dtype))
    assert array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable
    array[...] = 1
    assert array.sum() == array.size


def test_a_size_beyond_memory_is_a_memory_error():
    with pytest.raises(MemoryError, match="cannot be mapped"):
        zeroed_bytes(1 << 62)


@needs_madvise_mode
def test_large_buffers_are_not_on_huge_pages_unlike_numpys():
    assert huge_page_eligible(np.zeros(2 * HUGE_PAGES_FROM, np.uint8))  # what numpy asks for: the test can fail
    assert not huge_page_eligible(zeroed_bytes(2 * HUGE_PAGES_FROM))


@needs_madvise_mode
def test_optimizer_state_and_workspaces_are_on_small_pages():
    parameter = Tensor(np.ones((1024, 2048), np.float32))
    state = zeros_like(parameter)
    assert state.data.shape == (1024, 2048) and state.data.dtype == np.float32 and not state.data.any()
    assert not huge_page_eligible(state.data)
    workspace, fresh = Workspaces(MemoryPlan((0, 1 << 16), 1, 0), [], "step").get(128)
    assert fresh and workspace.buffer.nbytes >= 128 << 16
    assert not huge_page_eligible(workspace.buffer)


def resident_bytes(array: np.ndarray) -> int:
    """Bytes of the page-aligned ``array`` that are in memory (``mincore``: the kernel merges
    neighbouring mappings, so /proc/self/smaps can count other memory with it)."""
    pages = -(-array.nbytes // mmap.PAGESIZE)
    vector = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), vector) == 0
    return sum(byte & 1 for byte in vector) * mmap.PAGESIZE


def test_large_buffers_are_faulted_in_by_a_background_thread():
    untouched = np.frombuffer(mmap.mmap(-1, 4 * HUGE_PAGES_FROM), np.uint8)  # what no one populates
    buffer = zeroed_bytes(4 * HUGE_PAGES_FROM)
    wait_populated()
    assert resident_bytes(untouched) == 0  # the test can fail
    assert resident_bytes(buffer) == buffer.nbytes and not buffer.any()


def test_populating_leaves_what_was_written_meanwhile():
    buffers = [zeroed_bytes(HUGE_PAGES_FROM + 4096 * i) for i in range(8)]
    for i, buffer in enumerate(buffers):
        buffer[::4096] = i + 1
    wait_populated()
    for i, buffer in enumerate(buffers):
        assert (buffer[::4096] == i + 1).all() and buffer.sum() == (i + 1) * len(buffer[::4096])


def _populate_in_child() -> None:
    buffer = zeroed_bytes(2 * HUGE_PAGES_FROM)
    wait_populated()
    os._exit(0 if resident_bytes(buffer) == buffer.nbytes else 1)


def test_a_forked_child_gets_a_worker_of_its_own():
    zeroed_bytes(HUGE_PAGES_FROM)  # the parent's worker exists
    child = multiprocessing.get_context("fork").Process(target=_populate_in_child)
    child.start()
    child.join(60)
    assert child.exitcode == 0
