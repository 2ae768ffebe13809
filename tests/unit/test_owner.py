"""The MPI thread's calls with a time limit (``Owner.call(..., timeout=...)``): a call not
taken in time, or taken and not returned in time, raises ``OwnerBusy`` (a watchdog and an
abort must go on beside a call stuck inside MPI), also for a ``functools.partial``, which
is what ``serial.call`` hands over when a call has keyword arguments (the watchdog's
``isend``): such a call once raised AttributeError instead, which killed the watchdog's
thread on a crawling link. No MPI here: the owner runs plain functions."""

import functools
import threading
import time

import pytest

from hpcddp.comm import owner as owner_module
from hpcddp.comm.backoff import Backoff, patient, waiting_patiently
from hpcddp.comm.owner import Owner, OwnerBusy


@pytest.fixture
def owner():
    """An owner thread of its own, as hpcddp starts one at MPI_THREAD_SERIALIZED and up."""
    made = Owner()
    made._decided = True
    made._thread = threading.Thread(target=made._run, name="test-owner", daemon=True)
    made._thread.start()
    yield made
    made.close()


def _work(seconds, result="done"):
    time.sleep(seconds)
    return result


def _hold(started, release):
    """Keep the owner until ``release`` is set (a call stuck inside MPI)."""
    started.set()
    release.wait(30)


def test_a_call_that_returns_in_time_gives_its_result(owner):
    assert owner.call(functools.partial(_work, seconds=0.0, result=7), timeout=5) == 7


def test_a_partial_taken_but_not_returned_in_time_raises_owner_busy(owner):
    started, release = threading.Event(), threading.Event()
    try:
        with pytest.raises(OwnerBusy, match=r"_hold did not return within 2 s"):
            owner.call(functools.partial(_hold, started=started, release=release), timeout=2)
        assert started.is_set()
    finally:
        release.set()


def test_a_partial_not_taken_in_time_raises_owner_busy_and_never_runs(owner):
    started, release, ran = threading.Event(), threading.Event(), []
    blocker = threading.Thread(target=owner.call, args=(_hold, started, release))
    blocker.start()
    try:
        assert started.wait(30)  # the owner is inside the first call now
        with pytest.raises(OwnerBusy, match=r"did not take .*append within 0.2 s"):
            owner.call(functools.partial(ran.append, 1), timeout=0.2)
    finally:
        release.set()
        blocker.join()
    owner.call(_work, 0.0)  # the owner is free again, and the refused call never ran
    assert ran == []


def _polls_until(owner, seconds):
    """Hand the owner a wait that ends ``seconds`` from now; how often it was polled."""
    polls, end = [], time.monotonic() + seconds

    def done():
        polls.append(1)
        return time.monotonic() >= end

    owner.until(done)
    return len(polls)


def test_a_patient_threads_wait_pauses_from_its_first_poll(owner):
    # An ordinary wait polls back to back first (2000 polls); a patient thread's wait
    # pauses from its first poll, 10 us doubling to 0.5 ms: at most about 110 polls
    # in 50 ms however fast the machine is.
    assert _polls_until(owner, 0.05) >= 2000
    with waiting_patiently():
        assert patient()
        assert _polls_until(owner, 0.05) < 300
    assert not patient()


def test_wake_has_a_patient_wait_polled_before_its_pause_ends(owner, monkeypatch):
    # The patient waits' pauses made 30 s long: only wake() gets the wait polled sooner.
    made = owner_module.mpi_polls
    monkeypatch.setattr(owner_module, "mpi_polls",
                        lambda patient=False: Backoff(0, 30, 30) if patient else made())
    fresh = Owner()
    fresh._decided = True
    fresh._thread = threading.Thread(target=fresh._run, name="test-owner", daemon=True)
    fresh._thread.start()
    ready, polled, returned = threading.Event(), threading.Event(), threading.Event()

    def done():
        polled.set()
        return ready.is_set()

    def waiter():
        with waiting_patiently():
            fresh.until(done)
        returned.set()

    threading.Thread(target=waiter, daemon=True).start()
    try:
        assert polled.wait(10)
        time.sleep(0.1)  # the owner is in its 30 s pause now
        ready.set()
        fresh.wake()
        assert returned.wait(10)
    finally:
        ready.set()
        fresh.wake()
        fresh.close()
