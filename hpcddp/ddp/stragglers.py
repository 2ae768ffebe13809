"""Name a rank that is much slower than the others, without stopping the job.

A slow rank (a throttled GPU, a node with a busy neighbour, a rank given fewer cores)
ends no wait by the timeout: every other rank waits for it a little in each reduction,
and the job runs at its pace. Every ``HPCDDP_STRAGGLER_STEPS`` synchronized steps the
ranks exchange how long each computed per step over those steps (its wall time less the
time its main thread waited in hpcddp), and rank 0 names, once, every rank that took
over ``FACTOR`` times the median of the others, with its node.
"""

import socket
import sys
import time
from typing import List, Set

from hpcddp.comm import activity

__all__ = ["FACTOR", "StragglerCheck"]

FACTOR = 2.0  # how many times the others' median compute time makes a rank a straggler


class StragglerCheck:
    """Counts synchronized steps; every ``every`` steps compares the ranks' compute time.

    Args:
        control: the DDP model's control communicator.
        every: steps between checks (``HPCDDP_STRAGGLER_STEPS``); 0: never.

    .. warning:: ``step()`` is collective every ``every`` calls: call it at the same point
       of each synchronized step on every rank.
    """

    def __init__(self, control, every: int):
        self.control, self.every = control, every
        self.steps = 0
        self.named: Set[int] = set()
        self._since, self._waited = time.monotonic(), activity.waited()
        self._host = socket.gethostname()

    def step(self) -> None:
        if not self.every or self.control.size < 2:
            return
        self.steps += 1
        if self.steps % self.every:
            return
        now, waited = time.monotonic(), activity.waited()
        computed = ((now - self._since) - (waited - self._waited)) / self.every
        self._since, self._waited = now, waited
        with activity.named("DDP straggler check"):
            ranks = self.control.allgather((computed, self._host))
        if self.control.rank == 0 and self.steps > self.every:  # the first window starts up
            self._name(ranks)

    def _name(self, ranks: List[tuple]) -> None:
        medians = _medians_of_the_others([computed for computed, _ in ranks])
        for rank, ((computed, host), others) in enumerate(zip(ranks, medians)):
            if rank in self.named or computed <= FACTOR * max(others, 1e-6):
                continue
            self.named.add(rank)
            sys.stderr.write(
                f"hpcddp: rank {rank} on {host} is {computed / max(others, 1e-6):.1f}x slower "
                f"than the other ranks: {computed * 1e3:.1f} ms of its own work per step "
                f"against a median of {others * 1e3:.1f} ms over the last {self.every} "
                f"synchronized steps, so every other rank waits for it in each reduction. "
                f"Training goes on; look at that rank's node (its load, clocks, GPU), or its "
                f"share of the data (HPCDDP_STRAGGLER_STEPS=0 turns this check off).\n")
            sys.stderr.flush()


def _medians_of_the_others(values: List[float]) -> List[float]:
    """For each value, the median of all the others: one sort, not one per value."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranked = [values[i] for i in order]
    place = {index: position for position, index in enumerate(order)}

    def without(k: int, j: int) -> float:  # the j-th smallest once position k is gone
        return ranked[j if j < k else j + 1]
    medians = []
    for index in range(len(values)):
        k, m = place[index], len(values) - 1
        middle = without(k, m // 2) if m % 2 else \
            (without(k, m // 2 - 1) + without(k, m // 2)) / 2
        medians.append(middle)
    return medians
