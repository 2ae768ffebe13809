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
