"""The ops behind the nn layers (erf, numel, dropout): shape rules, NumPy references, VJPs."""

import math

import numpy as np
import pytest

from mlir_nn.engine import Tensor, apply
from mlir_nn.ir import ShapeError, philox
from tests.gradcheck import check_grads

# Random123's known-answer vectors for Philox-4x32-10: (counter, key) -> output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox.philox4x32(counter, key)) == expected


def chunk_tensors(key, offset, dtype="float64"):
    values = philox.chunks(key, philox.KEY_CHUNKS) + philox.chunks(offset, philox.OFFSET_CHUNKS)
    return [Tensor(np.array(v, dtype)) for v in values]


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_dropout_keeps_one_minus_p_and_scales(p):
    x = np.ones((200, 500))
    out = apply("dropout", Tensor(x), *chunk_tensors(12345, 7), p=p, slot=0).data
    kept = out != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    if p < 1:
        np.testing.assert_array_equal(out[kept], 1 / (1 - p))


def test_dropout_masks_depend_on_key_offset_slot_and_position_only():
    x = np.ones((4, 6))

    def mask(key, offset, slot=0, shape=(4, 6)):
        return apply("dropout", Tensor(np.ones(shape)), *chunk_tensors(key, offset), p=0.5, slot=slot).data != 0

    first = mask(1, 10)
    np.testing.assert_array_equal(first, mask(1, 10))
    np.testing.assert_array_equal(mask(1, 9, slot=1), first)  # offset + slot is what counts
    assert not np.array_equal(first, mask(1, 11)) and not np.array_equal(first, mask(2, 10))
    np.testing.assert_array_equal(mask(1, 10, shape=(24,)), first.reshape(24))  # row-major positions
    big = (1 << 64) - 1, (1 << 48) - 2
    assert mask(*big).any() and x.shape == (4, 6)
    np.testing.assert_array_equal(philox.keep_mask((4, 6), 1, 10, 0.5), first)


def test_dropout_gradient_is_the_same_mask():
    chunks = chunk_tensors(3, 4)
    check_grads(lambda x: apply("dropout", x, *chunks, p=0.3, slot=2), [np.random.randn(3, 5)])


def test_dropout_shape_rule_names_what_is_wrong():
    x = Tensor(np.ones((2, 3)))
    with pytest.raises(ShapeError, match="dropout: expected x and 7 0-d key and offset chunks"):
        apply("dropout", x, *chunk_tensors(1, 1)[:-1], p=0.5, slot=0)
    with pytest.raises(ShapeError, match=r"dropout: expected x and 7 .* got \(2, 3\), \(2,\)"):
        apply("dropout", x, Tensor(np.ones(2)), *chunk_tensors(1, 1)[1:], p=0.5, slot=0)
    with pytest.raises(ValueError, match="dropout: p must be in"):
        apply("dropout", x, *chunk_tensors(1, 1), p=1.5, slot=0)


def test_erf_reference_and_gradient():
    x = np.linspace(-3, 3, 13)
    np.testing.assert_array_equal(apply("erf", Tensor(x)).data, [math.erf(v) for v in x])
    assert apply("erf", Tensor(x.astype(np.float32))).dtype == "float32"
    check_grads(lambda t: apply("erf", t), [np.random.randn(2, 3)], rtol=1e-7)


def test_numel_counts_along_axes():
    x = Tensor(np.ones((3, 4, 5)))
    assert apply("numel", x, axes=(0, 2)).data == 15.0 and apply("numel", x, axes=(1,)).shape == ()
    with pytest.raises(ValueError, match="numel"):
        apply("numel", x, axes=(3,))
