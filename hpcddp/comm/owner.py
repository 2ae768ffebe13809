"""The one thread that enters MPI.

Once MPI runs at ``MPI_THREAD_SERIALIZED`` or above, every MPI call hpcddp makes, from
any thread, is carried out by one helper thread, the owner (``hpcddp-mpi``), as
Horovod's background thread and torch's gloo and NCCL work threads do: the calling
thread hands the call over and sleeps until the owner has made it. A wait
for MPI (a request, a blocking collective, a probe for a message) is handed over whole:
the owner polls it beside every other wait and call, and wakes the waiting thread when
it completes. So no two threads are ever inside MPI, and a thread that waits for MPI
is never inside it: the watchdog's questions go in between the polls of the main
thread's longest wait. A step that needs no answer (a gradient hook's launch of its
bucket) is posted instead: the owner makes it in turn and the caller goes on computing,
so on idle cores (a GPU's backward) the reduction moves beside the backward.

What runs on the owner is MPI and nothing that waits for another thread: a call
handed over must never take a lock that a thread waiting for the owner may hold.

Below ``MPI_THREAD_SERIALIZED`` (single, funneled) only the main thread may call MPI
and hpcddp starts no helper that does; calls are made by the calling thread.
"""

import _thread
import contextlib
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Iterator, List, Optional

from hpcddp.comm.backoff import Backoff, mpi_polls, patient

__all__ = ["Owner", "OwnerBusy", "OWNER"]

# A wait is polled as every wait for MPI is (``mpi_polls``); a call handed over cuts a
# pause short. The owner polls nothing while no thread waits for it: a thread that wakes
# to poll takes Python's GIL and the core from the thread computing (DDP steps are slower
# with one, docs/benchmark-history.md), so MPI moves operations nobody waits for yet when hpcddp
# hands it a call (a gradient hook's ``advance``), as it would without the owner.
# While ``progressing`` (DDP's backward with HPCDDP_PROGRESS_THREAD) and no thread waits,
# the owner nudges the operations in flight (``nudge``) on its own, sleeping between: from
# 50 us after a call handed over (a bucket just launched) up to 0.5 ms. The pauses are
# sleeps, never spins, so the thread computing the backward keeps the GIL and the core.
_MOVE_FIRST, _MOVE_CAP = 5e-5, 5e-4


_MAIN = threading.main_thread()


class OwnerBusy(TimeoutError):
    """The owner did not take a call within the time given (it is inside a call that
    has not returned: a collective a lost rank never joins)."""


class _Task:
    """A call handed to the owner, or a wait it polls; its caller sleeps until ``done``.

    Completion is a lock held from the start and released by the owner: the cheapest
    wake-up Python has (an ``Event`` builds a condition and a lock per wait).
    """

    __slots__ = ("fn", "args", "_done", "value", "error", "started", "nudge", "patient")

    def __init__(self, fn: Callable, args=(), nudge: bool = False, patient: bool = False):
        self.fn, self.args, self.nudge, self.patient = fn, args, nudge, patient
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.started = False

    def run(self) -> bool:
        """Call ``fn``; True once it has returned something true or raised."""
        try:
            self.value = self.fn(*self.args)
        except BaseException as error:  # noqa: BLE001 - handed back to the caller
            self.error = error
            return True
        return bool(self.value)

    def finish(self) -> None:
        self._done.release()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Sleep until the owner has finished this; False if ``timeout`` ran out first."""
        if self._done.acquire(timeout=-1 if timeout is None else timeout):
            self._done.release()  # later waits return at once
            return True
        return False

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Owner:
    """The thread that makes every MPI call of this process.

    Example::

        OWNER.call(MPI.Request.Test, request)        # a call, made by the owner
        OWNER.until(lambda: MPI.Request.Test(request))  # a wait, polled by the owner
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._calls: Deque[_Task] = deque()
        self._waits: List[_Task] = []
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._added = 0  # waits handed over so far
        self._woken = False  # wake(): poll the waits now, not after the pause
        self._moved = False  # moved(): a posted step got something done
        self._progressing = 0  # ``progressing()`` blocks open now
        self._decided = False
        self._inline = threading.RLock()  # no owner: one caller at a time
        self.nudge: Callable[[], None] = lambda: None  # set by hpcddp.comm.serial
        # Seconds the main thread has slept waiting for the owner while ``counted()``
        # (hpcddp.comm.activity: outside its own waits), for ``activity.waited()``.
        self.main_blocked = 0.0
        self.counted: Callable[[], bool] = lambda: True

    # -- deciding ------------------------------------------------------------------------

    def _decide(self) -> None:
        """Start the owner once MPI's thread level allows a helper thread inside it."""
        from mpi4py import MPI

        with self._cond:
            if self._decided or not MPI.Is_initialized() or MPI.Is_finalized():
                return
            self._decided = True
            if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
                return
            self._thread = threading.Thread(target=self._run, name="hpcddp-mpi", daemon=True)
            self._thread.start()

    @property
    def thread(self) -> Optional[threading.Thread]:
        """The owner thread (None where the calling thread makes its own calls)."""
        if not self._decided:
            self._decide()
        return self._thread

    def owns(self) -> bool:
        """Whether the calling thread may enter MPI now (it is the owner, or there is none)."""
        thread = self.thread
        return thread is None or thread is threading.current_thread()

    # -- calls and waits -----------------------------------------------------------------

    def call(self, fn: Callable, *args, timeout: Optional[float] = None) -> Any:
        """``fn(*args)`` made by the owner; its result, or its exception raised here.

        Args:
            timeout: seconds the owner may take to start the call, and then to finish it;
                None: as long as it takes.

        Raises:
            OwnerBusy: not started within ``timeout`` (then it never runs), or started
                and not finished within ``timeout`` more (a call stuck inside MPI: a
                watchdog or an abort must still go on).
        """
        if self.owns():
            if self._thread is None:
                with self._inline:
                    return fn(*args)
            return fn(*args)
        task = _Task(fn, args)
        since = self._since()
        with self._cond:
            self._calls.append(task)
            self._cond.notify()
        try:
            if not task.wait(timeout):
                with self._cond:
                    if not task.started:
                        self._calls.remove(task)
                        raise OwnerBusy(f"hpcddp: the MPI thread did not take {_named(fn)} "
                                        f"within {timeout:g} s")
                if not task.wait(timeout):
                    raise OwnerBusy(f"hpcddp: {_named(fn)} did not return within "
                                    f"{timeout:g} s on the MPI thread")
        finally:
            self._count(since)
        return task.result()

    def until(self, done: Callable[[], Any], nudge: bool = False) -> Any:
        """Poll ``done()``, an MPI test that never blocks, on the owner until it returns
        something true; return that. The calling thread sleeps meanwhile. With ``nudge``,
        the owner also calls ``self.nudge()`` between polls."""
        if self.owns():
            return self._poll_here(done, nudge)
        task = _Task(done, nudge=nudge, patient=patient())
        since = self._since()
        with self._cond:
            self._waits.append(task)
            self._added += 1
            self._cond.notify()
        try:
            task.wait()
        except BaseException:  # interrupted (Ctrl-C): the owner stops polling it
            with self._cond:
                if task in self._waits:
                    self._waits.remove(task)
            raise
        finally:
            self._count(since)
        return task.result()

    def wake(self) -> None:
        """Have the owner poll its waits now rather than after its pause: what one of
        them waits for changed other than through MPI (the caller queued work for it)."""
        with self._cond:
            self._woken = True
            self._cond.notify()

    def post(self, step: Callable[[], Any], patient: bool = False) -> bool:
        """Have the owner call ``step()``, which never blocks and raises nothing, until it
        returns something true, without waiting for it: the caller goes on at once. The
        owner makes it in turn with the calls and waits handed over before it. False
        where there is no owner thread to post to (the caller makes its own calls).
        A ``patient`` step is polled as a patient wait is (``waiting_patiently``); it
        calls ``moved()`` when it got something done, so the next poll comes soon.
        """
        thread = self.thread
        if thread is None or thread is threading.current_thread():
            return False
        with self._cond:
            self._waits.append(_Task(step, patient=patient))
            self._added += 1
            self._cond.notify()
        return True

    def moved(self) -> None:
        """Called by a posted step on the owner: it moved something, so the pauses
        between polls start short again."""
        self._moved = True

    @contextlib.contextmanager
    def progressing(self) -> Iterator[None]:
        """Within this block the owner also moves the operations in flight while no thread
        waits for it: it calls ``nudge()`` (each transport ``Test``s its pending
        requests and issues what is ready) with short sleeps between, as a progress
        thread would, with no call handed over. A no-op where there is no owner thread.

        Example::

            with OWNER.progressing():
                loss.backward()   # buckets launched by the hooks move between them
        """
        with self._cond:
            self._progressing += 1
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._progressing -= 1

    def _since(self) -> Optional[float]:
        """When the main thread began to wait for the owner, where that is to be counted."""
        if threading.current_thread() is _MAIN and self.counted():
            return time.monotonic()
        return None

    def _count(self, since: Optional[float]) -> None:
        if since is not None:
            self.main_blocked += time.monotonic() - since

    def _poll_here(self, done: Callable[[], Any], nudge: bool) -> Any:
        """A wait on the owner itself (or with no owner): poll, serving the others between."""
        polls = mpi_polls()
        while True:
            result = done()
            if result:
                return result
            if nudge:
                self.nudge()
            if self._thread is not None and self._turn():
                polls.reset()
            else:
                polls.pause()

    # -- the owner -----------------------------------------------------------------------

    def _turn(self) -> bool:
        """Make the calls handed over, poll every wait once; whether anything ended."""
        with self._cond:
            calls, self._calls = self._calls, deque()
            for task in calls:
                task.started = True
            waits = list(self._waits)
        for task in calls:
            task.run()
            task.finish()
        ended = []
        nudge = False
        for task in waits:
            if task.run():
                ended.append(task)
            nudge = nudge or task.nudge
        if nudge:
            self.nudge()
        if ended:
            with self._cond:
                for task in ended:
                    if task in self._waits:  # its caller, interrupted, may have taken it
                        self._waits.remove(task)
            for task in ended:
                task.finish()
        return bool(calls or ended)

    def _run(self) -> None:
        eager, gentle = mpi_polls(), mpi_polls(patient=True)
        moves = Backoff(0, _MOVE_FIRST, _MOVE_CAP)
        added = 0
        while True:
            with self._cond:
                while not (self._calls or self._waits or self._progressing or self._stopping):
                    self._cond.wait()
                if self._stopping and not self._calls:
                    return
                fresh, added = self._added != added, self._added  # a new wait: poll eagerly
                waiting = bool(self._waits)
                # Polled back to back only while some waiting thread is not patient.
                polls = gentle if all(t.patient for t in self._waits) else eager
            if not waiting:  # progressing, or calls only
                if self._turn():
                    moves.reset()
                if self._progressing:
                    self.nudge()
                    with self._cond:
                        if not (self._calls or self._waits):
                            self._cond.wait(moves.next_pause())
                continue
            if self._turn() or (fresh and polls is eager) or self._moved:
                self._moved = False
                eager.reset()
                gentle.reset()
                continue
            pause = polls.next_pause()
            if pause:
                with self._cond:
                    if not (self._calls or self._woken):
                        self._cond.wait(pause)
                    self._woken = False

    def close(self) -> None:
        """Stop the owner once the calls handed over are made; later calls are made by
        their callers (MPI_Finalize, on the main thread). Waits still pending stay
        pending: their callers are gone by then."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        thread.join(timeout=5.0)
        with self._cond:
            self._thread = None


    def _forked(self) -> None:
        """In a forked child (a DataLoader worker) the owner thread does not exist: the
        child makes its own calls, if any (MPI is not usable there anyway)."""
        nudge = self.nudge
        self.__init__()
        self._decided, self.nudge = True, nudge


def _named(fn: Callable) -> str:
    """What a call is, in a message: a ``functools.partial`` (``serial.call`` with keyword
    arguments) by the function it wraps."""
    fn = getattr(fn, "func", fn)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


OWNER = Owner()
os.register_at_fork(after_in_child=OWNER._forked)
