"""Float64 central finite differences, the yardstick for every VJP rule."""

from collections.abc import Callable

import numpy as np

from mlir_nn.engine import Tensor


def numeric_grads(f: Callable[..., np.ndarray], arrays: list[np.ndarray], weight: np.ndarray,
                  eps: float = 1e-6) -> list[np.ndarray]:
    """d sum(f(*arrays) * weight) / d arrays[i], by central differences."""
    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (np.sum(f(*plus) * weight) - np.sum(f(*minus) * weight)) / (2 * eps)
        grads.append(g)
    return grads


def check_grads(build: Callable[..., Tensor], arrays: list[np.ndarray], rtol: float = 1e-5,
                atol: float = 1e-6) -> None:
    """Compare autodiff gradients of ``build`` with finite differences (float64)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    tensors = [Tensor(a) for a in arrays]
    out = build(*tensors)
    weight = np.random.default_rng(1).standard_normal(out.shape)
    (out * Tensor(weight)).sum().backward()

    def f(*xs: np.ndarray) -> np.ndarray:
        return build(*[Tensor(x) for x in xs]).data

    for t, expected in zip(tensors, numeric_grads(f, arrays, weight)):
        np.testing.assert_allclose(t.grad, expected, rtol=rtol, atol=atol)
