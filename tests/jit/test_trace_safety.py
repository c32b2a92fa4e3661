"""What a trace cannot capture is an error naming the user's line, never a frozen value."""

import random

import numpy as np
import pytest

import mlir_nn
from mlir_nn.engine import Tensor

THIS_FILE = __file__


def _jit(fn, **kwargs):
    return mlir_nn.jit(fn, backend="numpy", tiered=False, **kwargs)


@pytest.mark.parametrize("convert,what", [
    (float, r"float\(\)"), (int, r"int\(\)"), (bool, r"bool\(\)"), (lambda t: t.item(), r"Tensor.item\(\)"),
    (np.asarray, r"np.asarray\(\)"), (lambda t: 1 if t > 0 else 0, r"bool\(\)"),
])
def test_a_traced_tensor_turned_into_a_python_value_names_the_line(convert, what):
    def step(x):
        s = x.sum()
        convert(s)
        return s

    with pytest.raises(mlir_nn.ConcretizationError, match=what) as info:
        _jit(step)(np.ones(3))
    message = str(info.value)
    assert f"{THIS_FILE}:" in message and "return it from the step" in message


def test_a_captured_parameter_is_not_read_as_a_frozen_number():
    w = Tensor(np.array([2.0]))

    def step(x):
        y = x * w
        return y * float(w)

    with pytest.raises(mlir_nn.ConcretizationError, match=r"float\(\) of a traced tensor"):
        _jit(step)(np.ones(1))


def test_eager_and_constant_values_still_convert():
    def step(x):
        scale = float(Tensor(np.array(3.0)))  # made inside the step: a constant
        return x * scale

    np.testing.assert_array_equal(_jit(step)(np.ones(2)), [3.0, 3.0])


def _depth_by_random(x):
    y = x
    for _ in range(random.randint(0, 3)):
        y = y * 2.0
    return y


def _depth_by_numpy(x):
    return x * float(np.random.rand())


RNG = np.random.default_rng(0)


def _by_generator(x):
    return x * RNG.standard_normal()


@pytest.mark.parametrize("fn,line", [(_depth_by_random, "random.randint(0, 3)"),
                                     (_depth_by_numpy, "_depth_by_numpy"), (_by_generator, "_by_generator")])
def test_python_randomness_is_reported(fn, line):
    with pytest.raises(mlir_nn.PythonRandomError, match="Python randomness at") as info:
        _jit(fn)(np.ones(2))
    assert THIS_FILE in str(info.value) and line in str(info.value)
    assert "allow_python_random=True" in str(info.value)


def test_randomness_marked_as_intended_is_traced_once():
    random.seed(0)
    step = _jit(_depth_by_random, allow_python_random=True)
    first = step(np.ones(2))
    assert all(np.array_equal(step(np.ones(2)), first) for _ in range(5))  # one frozen draw, as asked


def test_randomness_outside_the_trace_and_in_eager_code_is_fine():
    random.seed(1)
    assert _depth_by_random(Tensor(np.ones(2))).shape == (2,)
    step = _jit(lambda x: x * 2.0)
    np.random.rand()
    step(np.ones(2))
