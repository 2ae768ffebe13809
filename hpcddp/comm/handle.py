"""Handles for non-blocking MPI operations.

A ``Handle`` owns the buffers of its operation until it completes (MPI reads and writes
them in the background, so they must stay alive), and runs its ``on_complete`` steps
exactly once, e.g. copying a staged result back. ``wait()`` is the one obvious wait
point; it returns the handle's ``result``.
"""

import time
from typing import Any, Callable, Iterable, Optional, Sequence

from mpi4py import MPI

from hpcddp.comm import activity, serial
from hpcddp.comm.backoff import Backoff

__all__ = ["Handle", "HandleTimeout", "wait_all"]



class HandleTimeout(TimeoutError):
    """A wait with a timeout ran out before the operation completed."""


class Handle:
    """The pending result of one or more MPI requests.

    Args:
        requests: the MPI requests of the operation.
        keep: objects that must outlive the requests (send/receive buffers).
        on_complete: called once, after every request has completed.
        statuses: keep the requests' statuses (for ``source()``).
        name: what the operation is, for messages ("allreduce of 4 float32 ...").
        result: what ``wait()`` returns.
        lock: guards the handle's completion (``hpcddp.comm.serial.LOCK`` by default,
            shared by the threads that may test it).

    Example::

        handle = Handle([comm.Iallreduce(MPI.IN_PLACE, buf)], keep=(buf,))
        ...            # compute while MPI works; handle.test() drives progress
        handle.wait()  # buf now holds the sum
    """

    __slots__ = ("name", "result", "channel", "seq", "call", "_requests", "_keep", "_callbacks",
                 "_done", "_statuses", "_lock")

    def __init__(self, requests: Sequence["MPI.Request"] = (), keep: Iterable = (),
                 on_complete: Optional[Callable[[], None]] = None, statuses: bool = False,
                 name: str = "MPI operation", result: Any = None, lock=None):
        self.name, self.result = name, result
        # The collective this is, for the watchdog: its channel and sequence number.
        self.channel: Optional[activity.Channel] = None
        self.seq: Optional[int] = None
        self.call: Optional[str] = None
        self._lock = lock if lock is not None else serial.LOCK
        self._requests = list(requests)
        self._keep = list(keep)
        self._callbacks = [] if on_complete is None else [on_complete]
        self._done = False
        # Even a Status is made with MPI calls.
        self._statuses = serial.call(_statuses, len(self._requests)) if statuses else None

    def keep_alive(self, *objects) -> "Handle":
        """Hold ``objects`` (more buffers) until the operation completes."""
        if not self._done:
            self._keep.extend(objects)
        return self

    def then(self, callback: Callable[[], None]) -> "Handle":
        """Run ``callback`` after completion, after the callbacks given before it."""
        if self._done:
            callback()
        else:
            self._callbacks.append(callback)
        return self

    def _finish(self):
        self._done = True
        callbacks, self._callbacks, self._keep = self._callbacks, [], []
        for callback in callbacks:
            callback()

    def test(self) -> bool:
        """Drive MPI progress; return True once the operation has completed.

        MPI makes no progress on a pending request while Python computes, so calling
        ``test()`` often is what lets communication overlap with computation.
        """
        with self._lock:
            if not self._done and serial.call(MPI.Request.Testall, self._requests,
                                              self._statuses):
                self._finish()
        return self._done

    def _block(self) -> None:
        """Wait until complete (no timeout): the MPI thread polls the requests while this
        one sleeps."""
        serial.wait_all(self._requests, self._statuses)
        with self._lock:  # tested again, completed requests would overwrite the statuses
            if not self._done:
                self._finish()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the operation completes; return ``result``.

        Args:
            timeout: seconds; None waits for as long as it takes.

        Raises:
            HandleTimeout: still incomplete after ``timeout`` seconds. The operation
                stays pending (MPI cannot cancel a collective), with its buffers held.

        .. warning:: Synchronization point: returns only when every rank taking part
           has contributed.
        """
        if self._done:
            return self.result
        with activity.waiting(self.name, self.channel, self.seq, self.call):
            if timeout is None:
                self._block()
            else:
                self._poll(timeout)
        return self.result

    def _poll(self, timeout: float) -> None:
        deadline, backoff = time.monotonic() + timeout, Backoff(spins=0)
        while not self.test():
            left = deadline - time.monotonic()
            if left <= 0:
                raise HandleTimeout(
                    f"hpcddp: {self.name} did not complete within {timeout:g} s: a rank "
                    f"taking part has not reached it yet. It stays pending (MPI cannot cancel "
                    f"a collective); wait again, or end the job")
            backoff.pause(longest=left)

    def source(self, index: int = 0) -> int:
        """The sender of request ``index`` (a receive), once complete; needs ``statuses=True``."""
        if self._statuses is None:
            raise ValueError("create the Handle with statuses=True to ask for the source")
        self.wait()
        return self._statuses[index].Get_source()

    @property
    def done(self) -> bool:
        return self._done

    def __repr__(self):
        return f"<Handle {self.name}: {'done' if self._done else 'pending'}>"


def _statuses(count: int):
    return [MPI.Status() for _ in range(count)]


def wait_all(handles: Iterable[Handle]) -> None:
    """Wait for every handle, in order."""
    for handle in handles:
        handle.wait()
