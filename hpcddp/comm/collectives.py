"""Handles for non-blocking MPI operations.

A ``Handle`` owns the buffers of its operation until it completes (MPI reads and writes
them in the background, so they must stay alive), and runs an optional ``on_complete``
step exactly once, e.g. copying a staged result back or dividing a sum into an average.
"""

from typing import Callable, Iterable, Optional, Sequence

from mpi4py import MPI

__all__ = ["Handle", "wait_all"]


class Handle:
    """The pending result of one or more MPI requests.

    Args:
        requests: the MPI requests of the operation.
        keep: objects that must outlive the requests (send/receive buffers).
        on_complete: called once, after every request has completed.

    Example::

        handle = Handle([comm.Iallreduce(MPI.IN_PLACE, buf)], keep=(buf,))
        ...            # compute while MPI works; handle.test() drives progress
        handle.wait()  # buf now holds the sum
    """

    __slots__ = ("_requests", "_keep", "_callbacks", "_done", "_statuses")

    def __init__(self, requests: Sequence["MPI.Request"], keep: Iterable = (),
                 on_complete: Optional[Callable[[], None]] = None, statuses: bool = False):
        self._requests = list(requests)
        self._keep = list(keep)
        self._callbacks = [] if on_complete is None else [on_complete]
        self._done = False
        self._statuses = [MPI.Status() for _ in self._requests] if statuses else None

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
        if not self._done and MPI.Request.Testall(self._requests, self._statuses):
            self._finish()
        return self._done

    def wait(self) -> None:
        """Block until the operation completes.

        .. warning:: Synchronization point: returns only when every rank taking part
           has contributed.
        """
        if not self._done:
            MPI.Request.Waitall(self._requests, self._statuses)
            self._finish()

    def source(self, index: int = 0) -> int:
        """The sender of request ``index`` (a receive), once complete; needs ``statuses=True``."""
        if self._statuses is None:
            raise ValueError("create the Handle with statuses=True to ask for the source")
        self.wait()
        return self._statuses[index].Get_source()

    @property
    def done(self) -> bool:
        return self._done


def wait_all(handles: Iterable[Handle]) -> None:
    """Wait for every handle, in order."""
    for handle in handles:
        handle.wait()
