"""Rank 0 decides, every rank learns the outcome, and an error is raised on every rank.

Checks that only one rank can make (a file exists, a checkpoint verifies, a self-test
passes) must end the same way on every rank: a value for all, or the same exception
raised by all. Raising on the deciding rank alone would leave the others waiting in
their next collective.
"""

import pickle
import time
from typing import Any, Callable

from hpcddp.comm import activity

__all__ = ["decide_on_root", "share_outcome"]


def _portable(outcome):
    """``outcome``, or a RuntimeError saying what it was when it cannot be pickled."""
    if not isinstance(outcome, BaseException):
        return outcome
    try:
        pickle.loads(pickle.dumps(outcome))
        return outcome
    except Exception:  # noqa: BLE001 - any failure to travel is replaced the same way
        return RuntimeError(f"{type(outcome).__name__}: {outcome}")


def share_outcome(comm, outcome: Any = None, root: int = 0, patient: bool = False,
                  what: str = "") -> Any:
    """Return root's ``outcome`` on every rank, raising it everywhere if it is an exception.

    Args:
        comm: the communicator.
        outcome: the value or exception, significant on ``root`` only.
        root: the deciding rank.
        patient: the other ranks wait with short sleeps instead of MPI's busy polling,
            leaving their cores to the root while it works (writing, hashing) for all.
        what: the decision, for the watchdog's reports.

    .. warning:: Collective.
    """
    with activity.named(f"{what or 'a decision'} from rank {root}"):
        if patient:  # a wait of its own: a barrier polled with short sleeps
            with activity.collective(comm, "Ibarrier"):
                arrived = comm.Ibarrier()
                while not arrived.Test():
                    time.sleep(0.0005)
        value = comm.bcast(_portable(outcome) if comm.rank == root else None, root=root)
    if isinstance(value, BaseException):
        raise value
    return value


def decide_on_root(comm, decide: Callable[..., Any], *args, root: int = 0,
                   patient: bool = False, what: str = "") -> Any:
    """Run ``decide(*args)`` on ``root``; return its value, or raise its error, on every rank.

    .. warning:: Collective.
    """
    outcome = None
    if comm.rank == root:
        try:
            outcome = decide(*args)
        except Exception as error:  # noqa: BLE001 - raised on every rank by share_outcome
            outcome = error
    return share_outcome(comm, outcome, root, patient, what or getattr(decide, "__name__", ""))
