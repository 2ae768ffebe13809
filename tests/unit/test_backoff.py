"""Polling with pauses: ``hpcddp.comm.backoff`` and the waits that use it."""

import time

from hpcddp.comm import backoff as backoff_module
from hpcddp.comm.backoff import Backoff, poll_until
from hpcddp.transport.allreduce.node_aware import _Slices


class _Clock:
    """Ready once ``seconds`` have passed; counts the polls until then."""

    def __init__(self, seconds):
        self.at, self.polls = time.monotonic() + seconds, 0

    def __call__(self):
        self.polls += 1
        return time.monotonic() >= self.at


def test_backoff_spins_first_then_pauses_growing_to_the_cap(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    backoff = Backoff(spins=3, first=1e-5, cap=1e-4)
    for _ in range(10):
        backoff.pause()
    assert slept == [1e-5, 2e-5, 4e-5, 8e-5, 1e-4, 1e-4, 1e-4]
    backoff.reset()
    backoff.pause()
    assert len(slept) == 7, "after a reset the first polls run back to back again"
    backoff.pause(), backoff.pause(), backoff.pause(longest=3e-6)
    assert slept[-1] == 3e-6


def test_giving_way_pauses_from_the_first_poll_of_every_wait(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.setattr(backoff_module, "_give_way", False)
    backoff = Backoff(spins=3, first=1e-5, cap=1e-4)
    backoff_module.give_way(True)
    assert backoff_module.giving_way()
    backoff.pause(), backoff.pause()
    assert slept == [1e-5, 2e-5], "a wait begun before the node was found crowded gives way"
    assert Backoff(spins=2000).next_pause() > 0
    backoff_module.give_way(False)
    backoff.reset()
    backoff.pause()
    assert len(slept) == 2 and Backoff(spins=2000).next_pause() == 0


def test_poll_until_pauses_while_nothing_is_ready():
    ready = _Clock(0.05)
    poll_until(ready)
    assert ready() and ready.polls < 500, ready.polls


class _Owner:
    def __init__(self, chains, clock):
        self.chains, self.clock, self.advances = chains, clock, 0

    def advance(self):
        self.advances += 1
        if self.clock():
            for chain in self.chains:
                chain.finished = True


class _Chain:
    finished = False


def test_node_aware_wait_does_not_spin():
    # The node-aware allreduce's request: Wait() polled Test() back to back for as long
    # as the slices took (~10^5 polls in 50 ms), a core and the GIL held by a loop
    # that only waits. Its pauses stop at 0.1 ms.
    chains = [_Chain(), _Chain()]
    owner = _Owner(chains, _Clock(0.05))
    _Slices(owner, chains).Wait()
    assert all(c.finished for c in chains) and owner.advances < 2000, owner.advances
