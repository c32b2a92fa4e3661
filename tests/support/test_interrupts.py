"""A SIGINT inside ``interrupts_deferred`` is delivered when the block ends, never inside it."""

import signal
import threading

import pytest

from mlir_nn.support.interrupts import interrupts_deferred


def test_a_sigint_inside_the_block_is_raised_after_it():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            done.append("rest of the block")
    assert done == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handler_installed_before_gets_it_once_and_nested_blocks_pass_it_on():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with interrupts_deferred():
            with interrupts_deferred():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)
            assert seen == []
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_error_in_the_block_propagates_and_the_handler_is_restored():
    with pytest.raises(ZeroDivisionError):
        with interrupts_deferred():
            raise ZeroDivisionError
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_other_threads_run_the_block_unchanged():
    errors = []

    def work():
        try:
            with interrupts_deferred():
                pass
        except BaseException as e:  # signal.signal would raise ValueError outside the main thread
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == []
