"""On/off environment settings (support/switches.py)."""

import pytest

from mlir_nn.support.switches import switch


@pytest.mark.parametrize("text, default, on", [(None, True, True), (None, False, False), ("", True, True),
                                               (" 1 ", False, True), ("0", True, False)])
def test_a_switch_reads_0_or_1_and_falls_back_to_its_default(monkeypatch, text, default, on):
    if text is None:
        monkeypatch.delenv("MLIR_NN_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("MLIR_NN_TEST_SWITCH", text)
    assert switch("MLIR_NN_TEST_SWITCH", default) is on


def test_anything_else_names_the_variable_and_what_1_does(monkeypatch):
    monkeypatch.setenv("MLIR_NN_TEST_SWITCH", "yes")
    with pytest.raises(ValueError, match=r"MLIR_NN_TEST_SWITCH must be 0 or 1 \(1: on\), got 'yes'"):
        switch("MLIR_NN_TEST_SWITCH", False, "1: on")
