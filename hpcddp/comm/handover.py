"""Calls and waits handed to the owner, the one thread that enters MPI
(``hpcddp.comm.owner``): ``call`` makes one call there, ``until``/``wait``/``wait_all``
have it poll a wait between its other calls while the caller sleeps, ``poll`` waits on
the caller's thread with MPI's pauses, ``post`` leaves a step for it to repeat, and
``keep_moving`` has it nudge what moves only when Python calls it (hpcddp's ring)
between the polls of every wait. ``polled_call`` runs a nonblocking operation and its
wait as one, and ``counted`` makes a blocking collective count itself for the watchdog.
``hpcddp.comm.serial`` builds its communicators on these, and re-exports them.

``LOCK`` guards the state of hpcddp's operations in flight (a transport's queues, a
handle's completion), which the training thread, the futures' thread and the owner's
nudges share; the owner never waits for it.
"""

import functools
import threading
import weakref
from typing import Any, Callable, Optional, Sequence

from mpi4py import MPI

from hpcddp.comm import activity
from hpcddp.comm.backoff import mpi_polls
from hpcddp.comm.owner import OWNER, OwnerBusy

__all__ = ["LOCK", "OwnerBusy", "call", "counted", "keep_moving", "moved", "mpi_call",
           "poll", "polled_call", "post", "stop_moving", "until", "wait", "wait_all",
           "wake"]

LOCK = threading.RLock()


def call(fn: Callable, *args, timeout: Optional[float] = None, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, an MPI call, made by the owner thread; its result.

    Args:
        timeout: seconds the owner may take to start it (``OwnerBusy`` after that);
            None: as long as it takes.
    """
    if kwargs:
        fn = functools.partial(fn, **kwargs)
    return OWNER.call(fn, *args, timeout=timeout)


def post(step: Callable[[], Any], patient: bool = False) -> bool:
    """Have the owner call ``step()`` until it returns something true, without waiting
    (``Owner.post``); False where the caller must make its own calls."""
    return OWNER.post(step, patient)


def moved() -> None:
    """From a step posted with ``patient``, on the MPI thread: it got something done
    (``Owner.moved``)."""
    OWNER.moved()


mpi_call = call  # its public name: ``hpcddp.mpi_call(comm.Iprobe)``

_MOVING = weakref.WeakSet()  # objects whose nudge() the waits below call


def keep_moving(obj) -> None:
    """Have ``obj.nudge()`` called between the polls of every blocking collective and
    request wait on hpcddp's communicators, for as long as ``obj`` lives.

    Some operations move only when Python calls them: hpcddp's ring and node-aware
    allreduce post each step's messages once the last step's have arrived. A rank
    blocked in another wait (the end-of-backward agreement, say) would leave them
    standing, and the other ranks' part of that wait may be behind them (a ``Join``
    notice of three ranks ahead of a joined rank's shadow backward did exactly that).
    ``nudge`` runs on the owner: it must never block and never wait for a lock.
    """
    _MOVING.add(obj)


def stop_moving(obj) -> None:
    """No more nudges for ``obj`` (closed: nothing of it is in flight)."""
    _MOVING.discard(obj)


def _nudge_all() -> None:
    for obj in list(_MOVING):
        obj.nudge()


OWNER.nudge = _nudge_all


def poll(done: Callable[[], Any], nudge: bool = False) -> Any:
    """Call ``done`` on the calling thread until it returns something true, and return
    that: a wait whose test does more than MPI (it takes ``LOCK``, or completes
    hpcddp's own operations); its MPI calls go through ``call``. The pauses are
    ``mpi_polls()``'s; with ``nudge``, the objects given to ``keep_moving`` are nudged
    between polls."""
    polls = mpi_polls()
    while True:
        result = done()
        if result:
            return result
        if nudge:
            _nudge_all()
        polls.pause()


def until(done: Callable[[], Any], nudge: bool = False) -> Any:
    """Have the MPI thread poll ``done()``, MPI tests that never block and take no lock,
    until it returns something true; return that. With ``nudge``, as ``wait``."""
    return OWNER.until(done, nudge)


def wake() -> None:
    """Have the MPI thread poll the waits handed to ``until`` now (``Owner.wake``)."""
    OWNER.wake()


def wait(request: "MPI.Request", status: Optional["MPI.Status"] = None,
         nudge: bool = False) -> None:
    """Complete ``request``: the owner tests it between its other calls."""
    OWNER.until(functools.partial(MPI.Request.Test, request, status), nudge)


def wait_all(requests: Sequence["MPI.Request"], statuses=None, nudge: bool = False) -> None:
    """Complete every one of ``requests`` (``MPI_Waitall``, polled by the owner)."""
    OWNER.until(functools.partial(MPI.Request.Testall, list(requests), statuses), nudge)


def polled_call(nonblocking, *args, **kwargs) -> None:
    """Start a nonblocking operation and wait for it, in one wait handed to the owner."""
    started = []

    def done():
        if not started:
            started.append(nonblocking(*args, **kwargs))
        return MPI.Request.Test(started[0])
    OWNER.until(done, nudge=True)


def counted(method):
    """``method``, a blocking collective, counted and waited in for the watchdog
    (``activity.collective``): every rank counts the same collectives, so no caller has
    to."""
    name = method.__name__

    @functools.wraps(method)
    def counted(self, *args, **kwargs):
        with activity.collective(self, name):
            return method(self, *args, **kwargs)
    return counted
