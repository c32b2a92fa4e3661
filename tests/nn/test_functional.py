import numpy as np
import torch

from mlir_nn.nn import functional as F


def test_activations_equal_pytorch_in_float64():
    x = np.random.randn(4, 5)
    for ours, theirs in ((F.relu, torch.relu), (F.tanh, torch.tanh), (F.sigmoid, torch.sigmoid)):
        np.testing.assert_allclose(ours(x).data, theirs(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-14)
    for dim in (0, 1, -1):
        np.testing.assert_allclose(F.softmax(x, dim=dim).data, torch.softmax(torch.tensor(x), dim).numpy(),
                                   rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(F.log_softmax(x, dim=dim).data,
                                   torch.log_softmax(torch.tensor(x), dim).numpy(), rtol=1e-12, atol=1e-14)
