import argparse

import pytest

from benchmarks.compile_time import depth_growth, parse_models


def test_models_are_depth_x_width_pairs():
    assert parse_models("1x64,4x64") == [(1, 64), (4, 64)]
    for bad in ("64", "1x64x2", "0x64", "ax64"):
        with pytest.raises(argparse.ArgumentTypeError, match="depth x width"):
            parse_models(bad)


def test_each_added_layer_is_priced_between_consecutive_depths():
    rows = [{"optimizer": "adam", "width": 64, "depth": d, "mlir_nn_s": t, "mlir_nn_optimized_s": 2 * t, "jax_s": 0.1}
            for d, t in ((4, 1.0), (1, 0.4), (8, 1.8))]
    rows.append({"optimizer": "adam", "width": 16, "depth": 1, "mlir_nn_s": 1, "mlir_nn_optimized_s": 1, "jax_s": 1})
    (line,) = depth_growth(rows)  # width 16 has one depth: no line
    assert "width   64" in line
    assert "1->4: +0.200 / +0.400 / +0.000" in line and "4->8: +0.200 / +0.400 / +0.000" in line
