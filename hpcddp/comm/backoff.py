"""How a thread polls something that is not ready yet: a few polls back to back, then
pauses that grow to a cap.

MPI makes progress only while some thread is inside it, so a wait on a request polls
(``Test``) instead of blocking; a wait on a CUDA event polls ``query()``. Polling back to
back with no pause holds a core and Python's GIL for as long as the wait lasts: the
watchdog, the progress thread and a DataLoader's pin thread starve, and on an
oversubscribed node the rank being waited for loses the core it needs. Pausing too long
adds the pause to every wait. So the first ``spins`` polls run back to back (a reduction
that is about to finish costs nothing more), then each pause doubles from ``first`` up
to ``cap``; a sleep of any length also releases the GIL.
"""

import contextlib
import threading
import time
from typing import Callable, Optional

__all__ = ["Backoff", "give_way", "giving_way", "mpi_polls", "patient", "poll_until",
           "waiting_patiently"]

# A wait for MPI, on the calling thread or on hpcddp's MPI thread, polls back to back for
# its first 2000 polls (a few milliseconds: a reduction about to finish costs nothing
# more), then with pauses that grow to 0.1 ms.
_MPI_SPINS, _MPI_FIRST, _MPI_CAP = 2000, 1e-5, 1e-4


def mpi_polls(patient: bool = False) -> "Backoff":
    """The pauses between the polls of one wait for MPI (every such wait's); a
    ``patient`` one (``waiting_patiently``) pauses from its first poll."""
    if patient:
        return Backoff(0, _MPI_FIRST, _PATIENT_CAP)
    return Backoff(_MPI_SPINS, _MPI_FIRST, _MPI_CAP)


# A helper thread that waits for MPI while the training thread computes (the Horovod
# engine's thread, reducing during backward) waits patiently: its waits pause from the
# first poll, up to 0.5 ms, since polls back to back would take the core from the
# backward it overlaps (docs/benchmarks.md#a-horovod-programs-step).
_PATIENT_CAP = 5e-4
_patient = set()


@contextlib.contextmanager
def waiting_patiently():
    """Within this block every wait for MPI of the calling thread pauses from its first
    poll."""
    ident = threading.get_ident()
    _patient.add(ident)
    try:
        yield
    finally:
        _patient.discard(ident)


def patient() -> bool:
    """Whether the calling thread waits patiently (``waiting_patiently``)."""
    return threading.get_ident() in _patient


# On a node with more ranks than cores every wait pauses from its first poll: a rank that
# polls back to back holds a core that the rank it waits for needs, until the scheduler
# takes it away, and every wait costs a time slice (docs/benchmarks.md#ddp-training-step,
# 3 ranks on 2 cores). Open MPI's
# ``mpi_yield_when_idle`` does the same for its own waits once it finds a node
# oversubscribed.
_give_way = False


def give_way(crowded: bool) -> None:
    """Pause from the first poll of every wait (``crowded``: more ranks than cores on this
    node), or spin first as each wait asks (not crowded, the default)."""
    global _give_way
    _give_way = bool(crowded)


def giving_way() -> bool:
    """Whether waits pause from their first poll (``give_way``)."""
    return _give_way


class Backoff:
    """The pauses between polls of one wait.

    Args:
        spins: polls run back to back before the first pause.
        first: the first pause, in seconds.
        cap: the longest pause.

    Example::

        backoff = Backoff()
        while not request.Test():
            backoff.pause()
    """

    __slots__ = ("spins", "first", "cap", "polls", "_next")

    def __init__(self, spins: int = 20, first: float = 1e-5, cap: float = 1e-3):
        self.spins, self.first, self.cap = spins, first, cap
        self.polls = 0
        self._next = first

    def pause(self, longest: Optional[float] = None) -> None:
        """Pause before the next poll (not at all during the first ``spins`` unless
        giving way), never longer than ``longest`` seconds where given."""
        pause = self.next_pause(longest)
        if self.polls > self.spins or _give_way:
            time.sleep(pause)

    def next_pause(self, longest: Optional[float] = None) -> float:
        """The pause before the next poll, in seconds (0 during the first ``spins``), for
        a caller that pauses its own way (on a condition a new task cuts short)."""
        self.polls += 1
        if self.polls <= self.spins and not _give_way:
            return 0.0
        pause = self._next if longest is None else max(0.0, min(self._next, longest))
        self._next = min(self._next * 2, self.cap)
        return pause

    def reset(self) -> None:
        """Something moved (a piece was issued or completed): poll eagerly again."""
        self.polls, self._next = 0, self.first


def poll_until(ready: Callable[[], bool], backoff: Optional[Backoff] = None) -> None:
    """Call ``ready()`` until it returns True, pausing between calls as ``backoff`` says."""
    backoff = backoff or Backoff()
    while not ready():
        backoff.pause()
