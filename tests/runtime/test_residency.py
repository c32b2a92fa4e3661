"""The residency ledger's decisions (what to copy, what is stale), and the resident block
on host backends. Copies between real devices are checked in tests/gpu/test_resident.py."""

import multiprocessing
import os
import signal
import threading

import numpy as np
import pytest

import mlir_nn
from mlir_nn.nn import MLP
from mlir_nn.optim import SGD
from mlir_nn.runtime import residency
from mlir_nn.runtime.residency import Ledger, Transfer
from mlir_nn.trainer import Trainer

TRAIN, FORWARD = "train step", "forward step"  # holder identities; the ledger never calls them


def run(ledger, holder, arrays, updated=(), resident=True, watched=()):
    """One step's bookkeeping, as a device step does it: plan, (copies,) applied, stepped."""
    plan = ledger.plan(holder, arrays, resident, watched)
    ledger.applied(plan)
    ledger.stepped(holder, arrays, updated, resident, plan)
    return [(t.holder, t.slot) for t in plan.downloads], [t.slot for t in plan.uploads]


@pytest.fixture
def state():
    w, b, lr = np.ones((3, 2), np.float32), np.zeros(2, np.float32), np.array(0.1, np.float32)
    return [w, b, lr]


def test_a_resident_step_uploads_once_and_keeps_its_results(state):
    ledger = Ledger()
    assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([], [0, 1, 2])
    for _ in range(3):
        assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([], [])
    assert ledger.downloads_for() == [Transfer(TRAIN, 0, state[0]), Transfer(TRAIN, 1, state[1])]
    assert ledger.transfers == {"downloads": 0, "uploads": 3}


def test_a_changed_hyperparameter_is_uploaded_alone(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1], watched=[2])
    state[2][()] = 0.05  # opt.lr = 0.05: the feed writes its array in place
    assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([], [2])
    assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([], [])
    state[2][()] = 0.05  # the same value again: nothing to copy
    assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([], [])


def test_another_step_on_the_same_arrays_gets_them_through_the_host(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1])
    weights = state[:2]
    assert run(ledger, FORWARD, weights) == ([(TRAIN, 0), (TRAIN, 1)], [0, 1])  # validation's forward pass
    assert run(ledger, TRAIN, state, updated=[0, 1]) == ([], [])  # its copies stayed current
    assert run(ledger, FORWARD, weights) == ([(TRAIN, 0), (TRAIN, 1)], [0, 1])  # but the forward's did not
    assert run(ledger, FORWARD, weights) == ([], [])


def test_two_training_steps_on_the_same_state_hand_it_over(state):
    ledger, other = Ledger(), "step of another loss function"
    for _ in range(2):  # the second time from the steady state
        run(ledger, TRAIN, state, updated=[0, 1], watched=[2])
    assert run(ledger, other, state, updated=[0, 1], watched=[2]) == ([(TRAIN, 0), (TRAIN, 1)], [0, 1, 2])
    assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([(other, 0), (other, 1)], [0, 1])
    assert run(ledger, TRAIN, state, updated=[0, 1], watched=[2]) == ([], [])


def test_a_non_resident_step_uploads_everything_and_is_not_tracked(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1])
    assert run(ledger, TRAIN, state, updated=[0, 1], resident=False) == ([(TRAIN, 0), (TRAIN, 1)], [0, 1, 2])
    assert ledger.holders() == set() and ledger.downloads_for() == []
    assert run(ledger, TRAIN, state, updated=[0, 1]) == ([], [0, 1, 2])


def test_host_writes_make_device_copies_stale_without_downloading_over_them(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1])
    ledger.forget([state[0]])  # load_state_dict wrote W
    assert ledger.downloads_for() == [Transfer(TRAIN, 1, state[1])]  # the loaded W is not overwritten
    assert run(ledger, TRAIN, state, updated=[0, 1]) == ([], [0])


def test_sync_forgets_every_copy(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1])
    run(ledger, FORWARD, state[:2])
    assert [(t.holder, t.slot) for t in ledger.downloads_for()] == []  # the forward step's download
    ledger.forget()
    assert ledger.holders() == set()
    assert run(ledger, TRAIN, state, updated=[0, 1]) == ([], [0, 1, 2])


def test_a_rebound_array_takes_its_slot_after_the_old_one_comes_down(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1])
    old = state[0]
    rebound = [np.full((3, 2), 2.0, np.float32)] + state[1:]  # p.data = new array (the step re-checks it)
    plan = ledger.plan(TRAIN, rebound, True)
    assert [(t.holder, t.slot, t.array is old) for t in plan.downloads] == [(TRAIN, 0, True)]
    assert [(t.slot, t.array is rebound[0]) for t in plan.uploads] == [(0, True)]
    ledger.applied(plan)
    ledger.stepped(TRAIN, rebound, [0, 1], True, plan)
    assert {id(t.array) for t in ledger.downloads_for()} == {id(rebound[0]), id(state[1])}


def test_a_failed_step_loses_its_copies(state):
    ledger = Ledger()
    run(ledger, TRAIN, state, updated=[0, 1])
    ledger.lost(TRAIN)
    assert ledger.downloads_for() == [] and ledger.holders() == set()


def test_resident_blocks_nest_and_end_on_exceptions():
    assert not residency.active()
    with pytest.raises(KeyError, match="inner"):
        with mlir_nn.resident():
            with mlir_nn.resident():
                assert residency.active()
            assert residency.active()
            raise KeyError("inner")
    assert not residency.active()


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_host_backends_compute_in_p_data_and_never_hold_copies(backend):
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((13, 2)), (rng.standard_normal(13) > 0).astype(int)
    model = MLP(2, [7, 1])
    trainer = Trainer(model, SGD(model.parameters(), lr=0.05), backend=backend)
    before = residency.LEDGER.transfers.copy()
    with mlir_nn.resident():
        trainer.train(X, y, n_epochs=2, batch_size=5, verbose=False)
        assert residency.LEDGER.holders() == set()
        mlir_nn.sync()  # nothing to copy
    assert residency.LEDGER.transfers == before


def _state_dict_in_child(model, done):
    model.state_dict()  # takes the ledger's lock
    done.set()


def test_a_forked_child_has_its_own_ledger_even_when_a_parent_thread_held_the_lock():
    model = MLP(2, [3, 1])
    held, release = threading.Event(), threading.Event()

    def hold():
        with residency.LEDGER.lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(30)
    context = multiprocessing.get_context("fork")
    done = context.Event()
    child = context.Process(target=_state_dict_in_child, args=(model, done), daemon=True)
    try:
        child.start()
        assert done.wait(30), "the child's state_dict() waited on the parent thread's lock"
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
        release.set()
        thread.join()


def interrupt():
    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C; handled before the next statement runs


def test_in_a_resident_block_ctrl_c_waits_for_the_step_it_arrives_in():
    before = signal.getsignal(signal.SIGINT)
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with mlir_nn.resident():
            with residency.stepping():
                interrupt()
                finished.append("step")
            finished.append("after the step")  # not reached: raised when the step ended
    assert finished == ["step"]
    with pytest.raises(KeyboardInterrupt):
        with mlir_nn.resident():
            interrupt()  # between steps: at once
            finished.append("between steps")
    assert finished == ["step"]
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_a_resident_block_ctrl_c_is_not_deferred():
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with residency.stepping():
            interrupt()
            finished.append("step")
    assert finished == []
