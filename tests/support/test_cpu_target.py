"""The target the code generator plans for: the host's, or the one ``MLIR_NN_CPU_TARGET`` pins."""

from __future__ import annotations

import pytest

from mlir_nn.backends.cpu import codegen_digest
from mlir_nn.support import cpu_target
from mlir_nn.support.cpu_target import (
    PLANNED_TARGET_ENV,
    cache_blocks,
    data_cache_bytes,
    deep_kc,
    in_place_kc,
    register_block,
    vector_bytes,
)
from tests.conftest import replan


@pytest.fixture
def pinned(monkeypatch):
    def pin(text: str | None) -> None:
        if text is None:
            monkeypatch.delenv(PLANNED_TARGET_ENV, raising=False)
        else:
            monkeypatch.setenv(PLANNED_TARGET_ENV, text)
        replan()

    yield pin
    monkeypatch.delenv(PLANNED_TARGET_ENV, raising=False)
    replan()


def test_a_pinned_target_is_what_blocks_and_cache_keys_are_planned_for(pinned):
    pinned("64,48,1024")
    assert (vector_bytes(), data_cache_bytes()) == (64, {1: 48 << 10, 2: 1 << 20})
    assert register_block(4) == (12, 32) and cache_blocks(4) == (192, 512, 192)  # kc: half of L1 per panel
    wide = codegen_digest()
    pinned("32,32,512")
    assert register_block(4) == (6, 16) and cache_blocks(4)[2] == 256
    assert codegen_digest() != wide  # kernels planned for one target are not found for the other


def test_deep_slices_fill_l2_with_a_task_s_rows_of_a_and_never_go_shallower(pinned):
    pinned("32,32,512")  # Zen 3: 6 x 16 float32 register blocks, kc 256 fills half of L1 per panel
    assert deep_kc(96, 4) == 1024  # 96 x 1024 floats: 3/4 of L2; a panel's slice 1024 x 16: an eighth
    assert deep_kc(6, 4) == 1024  # (the panel's slice caps it)
    assert deep_kc(256, 4) == 384 and deep_kc(60, 8) == 816  # rounded down to 16
    assert deep_kc(1024, 4) == cache_blocks(4)[2] == 256
    pinned("64,48,1024")
    assert deep_kc(192, 4) == 1024 and deep_kc(4096, 4) == cache_blocks(4)[2]


def test_in_place_slices_fit_x_s_cache_lines_and_a_panel_s_slice_in_l1(pinned):
    pinned("32,32,512")  # Zen 3: 16-float panels, kc 256
    assert in_place_kc(400, 4) == 48  # 100 floats: 7 lines + a panel's 64 bytes per k, 3/4 of 32 KiB
    assert in_place_kc(256, 4) == 64 and in_place_kc(449, 4) == 32  # 4 lines; 8 lines: 24576 // 576 = 42
    assert in_place_kc(2048, 8) == 32  # never shallower than IN_PLACE_KC_MIN
    assert in_place_kc(32, 4) == 192 < cache_blocks(4)[2]  # one line and a panel's: 24576 // 128
    pinned("64,48,1024")
    assert in_place_kc(400, 4) == 64  # 7 lines + a 32-float panel's 128 bytes: 36864 // 576 = 64


@pytest.mark.parametrize("text", ["64", "24,48,1024", "64,0,1024", "avx512,48,1024", "64,48,1024,1"])
def test_a_malformed_target_is_a_value_error_naming_the_variable(pinned, text):
    pinned(text)
    with pytest.raises(ValueError, match=f"{PLANNED_TARGET_ENV} must be 'vector bytes"):
        cpu_target.vector_bytes()
