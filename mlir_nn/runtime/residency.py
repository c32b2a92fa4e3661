"""Where the current value of each parameter array is while device steps keep it there.

A compiled step on a device (``backend="cuda"``) keeps its own copy of every parameter
and optimizer-state array it takes. Outside a resident block it uploads ``p.data`` before
every call and writes the results back after it, so ``p.data`` is always current. Inside

    with mlir_nn.resident():      # Trainer.train runs its loop in one
        for x, y in batches:
            step(x, y)            # no parameter copies between host and device

a step uploads an array only when its device copy is not current, and leaves its results
on the device. The host arrays are brought up to date

* when the block ends, also when it ends with an exception (Ctrl-C waits for the step
  it arrives in to finish, so an interrupted loop keeps every step it completed);
* by ``mlir_nn.sync()``;
* when something else needs them: another step that takes the same arrays (the forward
  step that validation runs, a step traced for another loss function), ``state_dict()``.

The rule for code inside a resident block: read or write parameters (``p.data``, eager
calls of the model) only after ``mlir_nn.sync()``. It downloads every newer device copy
into ``p.data`` and forgets all device copies, so the next step uploads whatever
``p.data`` then holds. ``load_state_dict`` needs no ``sync()``: it marks the arrays it
writes as current on the host. Outside a resident block there is nothing to do.

Hyperparameters (0-d arrays a step only reads, fed from Python before every call, see
``mlir_nn.jit.feeds``) are compared by value before each resident step and uploaded when they
changed, so ``opt.lr = x`` takes effect on the next call as everywhere else.

The ``Ledger`` is the bookkeeping, plain Python with no device calls: for every host array
it knows which holders (device steps) have a current copy in which slot, and whether one
of them is newer than the host. Holders copy; the ledger only says what to copy.
Host backends (``numpy``, ``cpu``) compute in ``p.data`` itself and never appear in it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np


class Holder(Protocol):
    """A step with device copies of its parameter arrays, one slot per array."""

    def fetch(self, slot: int, array: np.ndarray) -> None:
        """Copy the device copy in ``slot`` into ``array`` (host)."""


@dataclass(frozen=True)
class Transfer:
    """One copy: between ``array`` (host) and ``holder``'s device copy in ``slot``."""

    holder: Hashable
    slot: int
    array: np.ndarray = field(compare=False)


@dataclass
class Plan:
    """What a step must copy before it runs: newer device copies down first, then its uploads."""

    downloads: list[Transfer]
    uploads: list[Transfer]
    watched: dict[int, bytes] = field(default_factory=dict)  # slot -> value uploaded, for watched slots
    key: tuple = ()  # the holder's arrays and watched values (see Ledger._steady)
    steady: bool = False  # the same step as the holder's last, with no change since: nothing to do


STEADY = Plan([], [], steady=True)  # the plan of a step in the steady state (never modified)


@dataclass
class _Copies:
    """The device copies of one host array that hold its current value."""

    array: np.ndarray
    slots: dict[Hashable, int] = field(default_factory=dict)  # holder -> slot
    newer: Hashable | None = None  # the holder whose copy is newer than the host array
    values: dict[Hashable, bytes] = field(default_factory=dict)  # watched arrays: the bytes each holder has


class Ledger:
    """Which device copies of which host arrays are current (see the module docstring).

    Holders call ``plan`` before a step, do its transfers, call ``applied``, run the step
    and call ``stepped``; ``lost`` when a step failed with its device copies half-written.
    Every call is made under ``lock``, which device steps also hold while they run.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._arrays: dict[int, _Copies] = {}  # id(host array) -> its copies (holding the array alive)
        self._slots: dict[tuple[Hashable, int], int] = {}  # (holder, slot) -> id of the array it holds
        self.transfers = {"downloads": 0, "uploads": 0}  # counted as applied, for tests and benchmarks
        # The steady state of a training loop, checked first: a holder whose last resident step
        # left nothing to copy, with no change to the ledger since (same generation), the same
        # arrays and the same watched values, has nothing to copy again.
        self._generation = 0  # bumped by every change
        self._steady: dict[Hashable, tuple[int, tuple]] = {}  # holder -> (generation, _key) after its step

    def plan(self, holder: Hashable, arrays: Sequence[np.ndarray], resident: bool,
             watched: Iterable[int] = ()) -> Plan:
        """The copies before ``holder`` runs on ``arrays`` (its slots in order).

        Newer copies held elsewhere come down first (and this holder's own, when it runs
        non-resident: it then uploads everything). Resident, it uploads each array its slot
        does not hold current, and each ``watched`` array whose value changed since."""
        watched = sorted(set(watched))
        key = _key(arrays, watched) if resident else ()
        if resident and self._steady.get(holder) == (self._generation, key):
            return STEADY
        downloads, uploads, values = [], [], {}
        # the watched values' bytes: the key's when resident, else read here
        watched_bytes = dict(zip(watched, key[1] if resident else [arrays[i].tobytes() for i in watched]))
        for slot, array in enumerate(arrays):
            copies = self._arrays.get(id(array))
            if copies is not None and copies.newer is not None and (copies.newer != holder or not resident):
                downloads.append(Transfer(copies.newer, copies.slots[copies.newer], array))
            replaced = self._slots.get((holder, slot))
            if replaced is not None and replaced != id(array):  # the slot held another array (p.data rebound)
                old = self._arrays[replaced]
                if old.newer == holder:
                    downloads.append(Transfer(holder, slot, old.array))
            value = watched_bytes.get(slot)
            current = copies is not None and copies.slots.get(holder) == slot \
                and (value is None or copies.values.get(holder) == value)
            if not resident or not current:
                uploads.append(Transfer(holder, slot, array))
                if value is not None:
                    values[slot] = value
        return Plan(downloads, uploads, values, key)

    def applied(self, plan: Plan) -> None:
        """``plan``'s transfers are done: downloaded arrays are current on the host, uploaded
        slots hold their arrays."""
        if plan.downloads or plan.uploads:
            self._generation += 1
        for t in plan.downloads:
            copies = self._arrays.get(id(t.array))
            if copies is not None and copies.newer == t.holder:
                copies.newer = None
        for t in plan.uploads:
            self._hold(t.holder, t.slot, t.array)
            if t.slot in plan.watched:
                self._arrays[id(t.array)].values[t.holder] = plan.watched[t.slot]
        self.transfers["downloads"] += len(plan.downloads)
        self.transfers["uploads"] += len(plan.uploads)

    def stepped(self, holder: Hashable, arrays: Sequence[np.ndarray], updated: Iterable[int],
                resident: bool, plan: Plan) -> None:
        """``holder`` ran a step, after ``plan``, that wrote new values of ``arrays[i]`` for ``i``
        in ``updated``: resident, into its device copies (now the only current ones); otherwise
        back into the host arrays, and its copies are not tracked further (it uploads
        everything next time)."""
        if resident and plan.steady and self._steady.get(holder, (None,))[0] == self._generation:
            return  # the same step again: its updates are the newer copies already
        self._generation += 1
        for slot in updated:
            copies = self._arrays[id(arrays[slot])]
            for other in [h for h in copies.slots if h != holder]:
                self._release(other, copies.slots[other])
            if resident:
                copies.newer = holder
            copies.values.pop(holder, None)
        if not resident:
            self.lost(holder)
        else:
            self._steady[holder] = (self._generation, plan.key)

    def lost(self, holder: Hashable) -> None:
        """Forget every copy ``holder`` has: its step failed with them half-written (the host
        keeps the values of the last synchronization) or its copies are no longer tracked."""
        self._steady.pop(holder, None)
        for key in [k for k in self._slots if k[0] == holder]:
            self._release(*key)

    def downloads_for(self, arrays: Iterable[np.ndarray] | None = None) -> list[Transfer]:
        """The downloads that make ``arrays`` (default: all) current on the host."""
        if arrays is None:
            chosen: Iterable[_Copies] = self._arrays.values()
        else:
            chosen = [c for c in (self._arrays.get(id(a)) for a in arrays) if c is not None]
        return [Transfer(c.newer, c.slots[c.newer], c.array) for c in chosen if c.newer is not None]

    def forget(self, arrays: Iterable[np.ndarray] | None = None) -> None:
        """The host copy of ``arrays`` (default: all) is the current value: drop their device
        copies, newer ones included (after downloading them, or because the host was written)."""
        if arrays is None:
            self._steady.clear()
        ids = list(self._arrays) if arrays is None else [id(a) for a in arrays]
        for key in ids:
            copies = self._arrays.get(key)
            if copies is not None:
                for holder, slot in list(copies.slots.items()):
                    self._release(holder, slot)

    def holders(self) -> set[Hashable]:
        """Every holder with a current device copy of some array."""
        return {holder for holder, _ in self._slots}

    def _hold(self, holder: Hashable, slot: int, array: np.ndarray) -> None:
        self._generation += 1
        replaced = self._slots.get((holder, slot))
        if replaced is not None and replaced != id(array):
            self._release(holder, slot)
        copies = self._arrays.setdefault(id(array), _Copies(array))
        copies.slots[holder] = slot
        self._slots[(holder, slot)] = id(array)

    def _release(self, holder: Hashable, slot: int) -> None:
        self._generation += 1
        key = self._slots.pop((holder, slot))
        copies = self._arrays[key]
        del copies.slots[holder]
        copies.values.pop(holder, None)
        if copies.newer == holder:
            copies.newer = None
        if not copies.slots:
            del self._arrays[key]


def _key(arrays: Sequence[np.ndarray], watched: Sequence[int]) -> tuple:
    """What a holder's steady state depends on: which arrays, and the watched values."""
    return tuple(map(id, arrays)), tuple([arrays[i].tobytes() for i in watched])


LEDGER = Ledger()
_scope = threading.local()


def _forget_after_fork() -> None:
    """A forked child has no device context: its device copies are gone, and a lock another
    thread of the parent held would stay held forever."""
    global LEDGER
    LEDGER = Ledger()


os.register_at_fork(after_in_child=_forget_after_fork)


def active() -> bool:
    """True inside a ``resident()`` block on this thread."""
    return getattr(_scope, "depth", 0) > 0


def fetch(arrays: Iterable[np.ndarray] | None = None) -> None:
    """Download newer device copies of ``arrays`` (default: all) into them; the device copies
    stay current (used by ``state_dict()``)."""
    with LEDGER.lock:
        transfers = LEDGER.downloads_for(arrays)
        for t in transfers:
            cast(Holder, t.holder).fetch(t.slot, t.array)
        LEDGER.applied(Plan(transfers, []))


def written(arrays: Iterable[np.ndarray]) -> None:
    """The host wrote ``arrays`` (``load_state_dict``): their device copies are stale."""
    with LEDGER.lock:
        LEDGER.forget(arrays)


def sync() -> None:
    """Bring every ``p.data`` up to date from the device and forget the device copies, so
    the next step uploads what ``p.data`` holds then (see the module docstring). If a copy
    fails, the device copies are forgotten all the same: the arrays not copied keep the
    values of their last synchronization."""
    with LEDGER.lock:
        try:
            fetch()
        finally:
            LEDGER.forget()


class stepping:
    """Marks a device step and its bookkeeping on this thread. Inside a resident block on the
    main thread, Ctrl-C (SIGINT) during it is raised when it ends: a step is never cut in
    half, so an interrupted ``Trainer.train`` keeps every step it completed."""

    def __enter__(self) -> None:
        _scope.stepping = True

    def __exit__(self, kind: type | None, *_: object) -> None:
        _scope.stepping = False
        if getattr(_scope, "interrupted", False):
            _scope.interrupted = False
            if kind is None:
                raise KeyboardInterrupt


def _defer_interrupts() -> Callable[[], None] | None:
    """On the main thread: make SIGINT wait for the running ``stepping()`` block; returns
    what restores the previous handler (None elsewhere, where signals never arrive)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler set from C: left alone
        return None

    def handler(signum: int, frame: Any) -> None:
        if getattr(_scope, "stepping", False):
            _scope.interrupted = True
        elif callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return lambda: signal.signal(signal.SIGINT, previous)


@contextmanager
def resident() -> Iterator[None]:
    """Device steps called in this block (on this thread) keep parameters and optimizer
    state on the device; ``p.data`` is brought up to date when it ends, even by an exception
    (Ctrl-C included: it waits for the step or copy it arrives in, see ``stepping``)."""
    outermost = not active()
    restore = _defer_interrupts() if outermost else None
    _scope.depth = getattr(_scope, "depth", 0) + 1
    try:
        yield
    except BaseException as error:
        if outermost:
            try:
                with stepping():
                    sync()
            except Exception as sync_error:
                error.add_note(f"the parameters could not all be copied back from the device ({sync_error}); "
                               "those not copied hold their values of the last synchronization")
        raise
    else:
        if outermost:
            with stepping():
                sync()
    finally:
        _scope.depth -= 1
        if restore is not None:
            restore()
