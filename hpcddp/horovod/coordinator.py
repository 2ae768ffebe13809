"""The coordinator's table (rank 0 of the job): each rank's request per (process set,
kind, name) until every rank of the set has asked, then the responses in the order the
operations became ready (``negotiate.ready_responses``); the ranks that joined; and the
stall check, every ``_STALL_CHECK_S`` at most, against ``HOROVOD_STALL_CHECK_TIME_SECONDS``
and ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (``HOROVOD_STALL_CHECK_DISABLE`` turns it off).
"""

import itertools
import logging
import os
import time
from typing import Dict, List, Tuple

from mpi4py import MPI

from hpcddp.horovod.negotiate import ready_responses, stalled
from hpcddp.horovod.requests import Pending, Request
from hpcddp.horovod.settings import number

__all__ = ["Table", "take_messages"]

log = logging.getLogger("hpcddp.horovod")

_STALL_CHECK_S = 0.25  # how often the coordinator looks for stalled names


class Table:
    """Requests by (set, kind, name) and what they make ready, over the engine's process
    ``sets`` (shared with it: a set added later is seen here)."""

    def __init__(self, sets, fusion_bytes: int):
        self.sets, self.fusion_bytes = sets, fusion_bytes
        disabled = os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0") not in ("", "0")
        self.stall_s = 0.0 if disabled else number("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0)
        self.stall_shutdown_s = number("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0)
        self._pending: Dict[Tuple[int, str, str], Pending] = {}
        # Names of a group that are ready while the rest of the group is not: looked at
        # again at every take (every other name is looked at only when a request of it,
        # or a join of its set, arrives).
        self._held: Dict[Tuple[int, str, str], Pending] = {}
        self._joined: Dict[int, List[int]] = {}  # per set, in join order
        self._arrivals = itertools.count()
        self._next_stall_check = 0.0

    def __bool__(self) -> bool:
        """Whether some operation waits for ranks."""
        return bool(self._pending)

    def stall_check_due(self) -> bool:
        return bool(self._pending) and time.monotonic() >= self._next_stall_check

    def take(self, requests: List[Request]) -> list:
        """Record ``requests``; the responses now ready, in order. Raises (ending the job)
        past ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` for a name some ranks never asked.

        Only the names these requests can have made ready are looked at: those asked
        for now, every name of a set a rank joined now, and the held names of groups
        (a step of a Horovod program sends a request per gradient, and looking over the
        whole table at each arrival cost the coordinator milliseconds a step)."""
        looked = self._held
        joins = set()
        for request in requests:
            key = request.key()
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = Pending(next(self._arrivals))
            pending.requests[request.rank] = request
            looked[key] = pending
            if request.kind == "join":
                self._joined.setdefault(request.set_id, []).append(request.rank)
                joins.add(request.set_id)
        if joins:  # a rank that joins no longer holds up any name of its set
            looked.update((key, pending) for key, pending in self._pending.items()
                          if key[0] in joins)
        responses = []
        if requests:
            left = dict(looked)
            responses = ready_responses(left, self.sets, self.fusion_bytes, self._joined)
            for key in looked.keys() - left.keys():
                del self._pending[key]
            self._held = {key: pending for key, pending in left.items()
                          if pending.requests[min(pending.requests)].group is not None}
        if self.stall_check_due():
            self._next_stall_check = time.monotonic() + _STALL_CHECK_S
            stalled(self._pending, self.sets, self.stall_s, self.stall_shutdown_s, log)
        return responses

    def clear(self) -> None:
        self._pending.clear()
        self._held = {}


def take_messages(comm, tag: int) -> list:
    """Every message of ``tag`` that has arrived on ``comm`` (lists, concatenated)."""
    got = []
    while True:
        message = MPI.Comm.improbe(comm, MPI.ANY_SOURCE, tag)
        if message is None:
            return got
        got.extend(message.recv())
