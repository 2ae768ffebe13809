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

    __slots__ = ("_requests", "_keep", "_on_complete", "_done")

    def __init__(self, requests: Sequence["MPI.Request"], keep: Iterable = (),
                 on_complete: Optional[Callable[[], None]] = None):
        self._requests = list(requests)
        self._keep = tuple(keep)
        self._on_complete = on_complete
        self._done = False

    def _finish(self):
        self._done = True
        callback, self._on_complete = self._on_complete, None
        self._keep = ()
        if callback is not None:
            callback()

    def test(self) -> bool:
        """Drive MPI progress; return True once the operation has completed.

        MPI makes no progress on a pending request while Python computes, so calling
        ``test()`` often is what lets communication overlap with computation.
        """
        if not self._done and MPI.Request.Testall(self._requests):
            self._finish()
        return self._done

    def wait(self) -> None:
        """Block until the operation completes.

        .. warning:: Synchronization point: returns only when every rank taking part
           has contributed.
        """
        if not self._done:
            MPI.Request.Waitall(self._requests)
            self._finish()

    @property
    def done(self) -> bool:
        return self._done


def wait_all(handles: Iterable[Handle]) -> None:
    """Wait for every handle, in order."""
    for handle in handles:
        handle.wait()
