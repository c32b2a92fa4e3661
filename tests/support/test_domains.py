"""Value domains of loaded state: counts and non-negative averages."""

import numpy as np
import pytest

from mlir_nn.support.domains import COUNT, NON_NEGATIVE, check_domain


@pytest.mark.parametrize(
    "domain,value",
    [
        (COUNT, np.float32(0)),
        (COUNT, np.array([3.0, 7.0])),
        (NON_NEGATIVE, np.array([0.0, 1e-30, 5.0])),
        (NON_NEGATIVE, np.zeros((2, 0))),
    ],
)
def test_values_inside_their_domain_pass(domain, value):
    check_domain(np.asarray(value), domain, "x")


@pytest.mark.parametrize(
    "domain,value,found",
    [
        (COUNT, np.float32(-1), "-1.0"),
        (COUNT, np.array([1.0, 1.5]), "1.5"),
        (COUNT, np.array(np.nan), "nan"),
        (NON_NEGATIVE, np.array([[1.0, -2.0]]), "-2.0"),
        (NON_NEGATIVE, np.array([np.nan]), "nan"),
    ],
)
def test_values_outside_their_domain_are_named(domain, value, found):
    with pytest.raises(ValueError, match=f"x must hold .*; it has {found}"):
        check_domain(np.asarray(value), domain, "x")
