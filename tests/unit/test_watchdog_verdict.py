"""Which rank of a job whose ranks time out together gives the verdict: a rank on another
node than rank 0's leaves it to rank 0's node for a while when a rank there did not answer
(the cluster's link faults, tests/cluster/test_faults.py, run it over real links)."""

import pytest

from hpcddp.comm import watchdog
from hpcddp.comm.watchdog import Watchdog

HOSTS = ["n1", "n1", "n2", "n2"]


def _watchdog(rank, departed=()):
    """A watchdog's decision state alone, on a job of 2 nodes x 2 ranks (no thread, no
    communicator: the decision reads only these)."""
    dog = Watchdog.__new__(Watchdog)
    dog.rank, dog.size, dog.hosts, dog.threaded = rank, len(HOSTS), HOSTS, True
    dog.departed = {r: {"channels": {}} for r in departed}
    dog.timeout = 10.0
    return dog


def _answer(waits=()):
    return {"waits": [{"seconds": s} for s in waits]}


@pytest.mark.parametrize("answered, cut_off", [
    ((), True),            # the whole node silent (a link down)
    ((1,), True),          # one answer got through a crawling link; rank 0's did not
    ((0,), True),
    ((0, 1), False),       # rank 0's node answered: the replies say who times out
    ((0, 1, 2), False),
])
def test_a_rank_off_rank_zeros_node_defers_while_a_rank_there_is_silent(answered, cut_off):
    dog = _watchdog(3)
    assert dog._cut_off_from_rank_zero({r: _answer() for r in answered}) is cut_off


def test_a_rank_that_left_is_not_silent():
    assert _watchdog(3, departed=(0,))._cut_off_from_rank_zero({1: _answer()}) is False


def test_ranks_on_rank_zeros_node_never_defer_to_it():
    assert _watchdog(1)._cut_off_from_rank_zero({}) is False


def test_a_lower_rank_about_to_time_out_gets_the_verdict():
    dog = _watchdog(3)
    # rank 1 has waited 7 of its 10 s: it reports within 3 s, plus its own asking.
    assert dog._lower_rank_timing_out({1: _answer([7.0]), 2: _answer()}) == \
        pytest.approx(3.0 + watchdog._ANSWER_SECONDS + 1.0)
    assert dog._lower_rank_timing_out({1: _answer(), 2: _answer()}) == 0.0  # none waits
