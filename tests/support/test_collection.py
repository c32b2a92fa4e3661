"""The garbage collector's pause: off inside, back on only when the last pause of any thread ends."""

import gc
import threading

from mlir_nn.support.collection import collection_paused


def test_pause_restores_the_collector():
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_resumes_after_the_last_thread():
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with collection_paused():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with collection_paused():
        thread.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread still holds its pause
    leave.set()
    thread.join(10)
    assert gc.isenabled()


def test_an_error_inside_still_resumes():
    try:
        with collection_paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
