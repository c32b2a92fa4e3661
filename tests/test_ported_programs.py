"""Well-known PyTorch programs ported by changing their imports (and adding ``@mlir_nn.jit`` to the
step), each run beside the same program in PyTorch: float64, the same initial weights (through
load_state_dict), the same batches; losses, parameters and buffers agree to 1e-10.

Where a program uses dropout, the PyTorch side multiplies by the masks mlir_nn drew (the two
generators differ); where it looks up embeddings, mlir_nn multiplies by one-hot rows (until
indexing lands)."""

import math

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import mlir_nn
from mlir_nn import nn
from mlir_nn.losses import cross_entropy, mse_loss
from mlir_nn.nn import functional as F
from mlir_nn.optim import SGD, Adam

TOL = dict(rtol=1e-10, atol=1e-12)
f64 = np.float64


def share(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def assert_same_state(ours, theirs):
    state = theirs.state_dict()
    assert list(ours.state_dict()) == list(state)
    for key, value in ours.state_dict().items():
        np.testing.assert_allclose(value, state[key].numpy(), **TOL, err_msg=key)


def digits():
    data = load_digits()
    return data.data / 16.0, data.target.astype(np.float64)


def batches(n, size, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.choice(n, size, replace=False) for _ in range(steps)]


def test_polynomial_fit_with_sequential():
    """"Learning PyTorch with Examples": y = sin(x) fitted by a third-order polynomial (nn version)."""
    x = np.linspace(-math.pi, math.pi, 2000)
    y = np.sin(x)
    xx = x[:, None] ** np.array([1, 2, 3])
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0, 1)).double()
    model = nn.Sequential(nn.Linear(3, 1, dtype=f64), nn.Flatten(0, 1))
    share(model, theirs)
    opt = SGD(model.parameters(), lr=1e-6)

    @mlir_nn.jit
    def step(xx, y):
        loss = ((model(xx) - y) ** 2).sum()
        model.zero_grad()
        loss.backward()
        opt.step()
        return loss

    xt, yt = torch.tensor(xx), torch.tensor(y)
    for _ in range(5):
        loss_t = (theirs(xt) - yt).pow(2).sum()
        theirs.zero_grad()
        loss_t.backward()
        with torch.no_grad():
            for param in theirs.parameters():
                param -= 1e-6 * param.grad
        np.testing.assert_allclose(step(xx, y), loss_t.item(), **TOL)
    assert_same_state(model, theirs)


class MaskedDropout(torch.nn.Module):
    """PyTorch's dropout with the masks given (x * mask / (1 - p))."""

    def __init__(self, p):
        super().__init__()
        self.p, self.masks = p, []

    def forward(self, x):
        return x * self.masks.pop(0) * (1 / (1 - self.p)) if self.training else x


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_mnist_model_on_digits_with_dropout(backend):
    """pytorch/examples' MNIST classifier as an MLP with Dropout, on scikit-learn's digits, Adam."""
    X, Y = digits()
    torch.manual_seed(0)
    drop = MaskedDropout(0.2)
    theirs = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), drop, torch.nn.Linear(128, 10)).double()
    model = nn.Sequential(nn.Linear(64, 128, dtype=f64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10, dtype=f64))
    share(model, theirs)
    opt, opt_t = Adam(model.parameters(), lr=1e-3), torch.optim.Adam(theirs.parameters(), lr=1e-3)

    @mlir_nn.jit(backend=backend)
    def step(x, y):
        opt.zero_grad()
        loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    picks = batches(len(X), 64, 4) + batches(len(X), 17, 1, seed=1)
    mlir_nn.manual_seed(0)
    losses = [step(X[i], Y[i]) for i in picks]
    mlir_nn.manual_seed(0)  # the same masks again, for the PyTorch side
    drop.masks = [torch.tensor(F.dropout(np.ones((len(i), 128)), 0.2).data != 0) for i in picks]
    for i, loss in zip(picks, losses):
        opt_t.zero_grad()
        loss_t = torch.nn.functional.cross_entropy(theirs(torch.tensor(X[i])), torch.tensor(Y[i]).long())
        loss_t.backward()
        opt_t.step()
        np.testing.assert_allclose(loss, loss_t.item(), **TOL)
    assert_same_state(model, theirs)
    model.eval()
    theirs.eval()
    np.testing.assert_allclose(model(X[:50]).data, theirs(torch.tensor(X[:50])).detach().numpy(), **TOL)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 32, dtype=f64), nn.ReLU(), nn.Linear(32, 8, dtype=f64))
        self.decoder = nn.Sequential(nn.Linear(8, 32, dtype=f64), nn.ReLU(), nn.Linear(32, 64, dtype=f64),
                                     nn.Sigmoid())

    def forward(self, x):
        return self.decoder(self.encoder(x))


class TorchAutoEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        self.decoder = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64),
                                           torch.nn.Sigmoid())

    def forward(self, x):
        return self.decoder(self.encoder(x))


def test_autoencoder_on_digits():
    X, _ = digits()
    torch.manual_seed(0)
    theirs = TorchAutoEncoder().double()
    model = AutoEncoder()
    share(model, theirs)
    opt, opt_t = Adam(model.parameters(), lr=1e-2), torch.optim.Adam(theirs.parameters(), lr=1e-2)

    @mlir_nn.jit
    def step(x):
        opt.zero_grad()
        loss = mse_loss(model(x), x)
        loss.backward()
        opt.step()
        return loss

    for i in batches(len(X), 32, 5):
        xt = torch.tensor(X[i])
        opt_t.zero_grad()
        loss_t = torch.nn.functional.mse_loss(theirs(xt), xt)
        loss_t.backward()
        opt_t.step()
        np.testing.assert_allclose(step(X[i]), loss_t.item(), **TOL)
    assert_same_state(model, theirs)


NAMES = ("emma olivia ava isabella sophia charlotte mia amelia harper evelyn abigail emily elizabeth mila ella "
         "avery sofia camila aria scarlett victoria madison luna grace chloe penelope layla riley zoey nora").split()
BLOCK, VOCAB = 3, 27


def makemore_data():
    """Karpathy's makemore dataset: every 3-character context of each name and the next character."""
    stoi = {c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")} | {".": 0}
    X, Y = [], []
    for word in NAMES:
        context = [0] * BLOCK
        for ch in word + ".":
            X.append(context)
            Y.append(stoi[ch])
            context = context[1:] + [stoi[ch]]
    return np.array(X), np.array(Y)


class MakeMore(nn.Module):
    """makemore part 3: embedding, Linear without bias, BatchNorm1d, tanh, Linear."""

    def __init__(self, n_embd=10, n_hidden=64):
        super().__init__()
        self.C = nn.Parameter(np.random.randn(VOCAB, n_embd))
        self.net = nn.Sequential(nn.Linear(BLOCK * n_embd, n_hidden, bias=False, dtype=f64),
                                 nn.BatchNorm1d(n_hidden, dtype=f64), nn.Tanh(), nn.Linear(n_hidden, VOCAB, dtype=f64))

    def forward(self, onehot):  # (batch * BLOCK, VOCAB) one-hot rows: C[X] as a product
        return self.net((onehot @ self.C).reshape(onehot.shape[0] // BLOCK, -1))


class TorchMakeMore(torch.nn.Module):
    def __init__(self, n_embd=10, n_hidden=64):
        super().__init__()
        self.C = torch.nn.Parameter(torch.randn(VOCAB, n_embd))
        self.net = torch.nn.Sequential(torch.nn.Linear(BLOCK * n_embd, n_hidden, bias=False),
                                       torch.nn.BatchNorm1d(n_hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(n_hidden, VOCAB))

    def forward(self, X):
        return self.net(self.C[X].view(X.shape[0], -1))


def test_makemore_mlp_with_batchnorm():
    X, Y = makemore_data()
    onehot = np.eye(VOCAB)[X].reshape(-1, BLOCK, VOCAB)
    torch.manual_seed(0)
    theirs = TorchMakeMore().double()
    model = MakeMore()
    share(model, theirs)
    opt, opt_t = SGD(model.parameters(), lr=0.1), torch.optim.SGD(theirs.parameters(), lr=0.1)

    @mlir_nn.jit(dynamic_batch=False)
    def step(xoh, y):
        loss = cross_entropy(model(xoh), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for i in batches(len(X), 32, 5):
        opt_t.zero_grad()
        loss_t = torch.nn.functional.cross_entropy(theirs(torch.tensor(X[i])), torch.tensor(Y[i]))
        loss_t.backward()
        opt_t.step()
        np.testing.assert_allclose(step(onehot[i].reshape(-1, VOCAB), Y[i].astype(f64)), loss_t.item(), **TOL)
    assert_same_state(model, theirs)  # running statistics included
    model.eval()
    theirs.eval()
    np.testing.assert_allclose(model(onehot[:5].reshape(-1, VOCAB)).data,
                               theirs(torch.tensor(X[:5])).detach().numpy(), **TOL)
