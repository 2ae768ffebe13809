"""Which rank of a job whose ranks time out together gives the verdict: a rank on another
node than rank 0's leaves it to rank 0's node for a while when a rank there did not answer
(the cluster's link faults, tests/cluster/test_faults.py, run it over real links); and
which nodes the verdict names: silent ones, and slow ones whose answers crawled in while
every rank waited (the fault soak's crawling links, benchmarks/bench_faults.py)."""

import pytest

from hpcddp.faults import watchdog
from hpcddp.faults import suspects
from hpcddp.faults.report import wait_report_text
from hpcddp.faults.suspects import silent_nodes, slow_nodes
from hpcddp.faults.watchdog import Watchdog

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


# -- which nodes a report names (hpcddp.faults.suspects), on 3 nodes x 1 rank -------------

THREE = ["n1", "n2", "n3"]


def _waiting(answered_s):
    return {"waits": [{"seconds": 10.0}], "answered_s": answered_s}


def test_a_node_whose_answers_crawl_is_named_slow_though_every_rank_arrived():
    # Over a link at 8 kbit/s rank 2's answer got through, after 2.9 s; rank 1's at once.
    replies = {1: _waiting(0.01), 2: _waiting(2.9)}
    assert slow_nodes(THREE, 0, replies) == [{"node": "n3", "ranks": [2], "seconds": 2.9}]
    assert silent_nodes(THREE, 0, [], replies, {}) == []


@pytest.mark.parametrize("reply", [
    _waiting(suspects.SLOW_ANSWER_SECONDS - 0.01),           # in time
    {"waits": [], "answered_s": 3.0},                      # in user code: may hold the GIL
])
def test_a_prompt_answer_or_one_from_user_code_names_no_slow_node(reply):
    assert slow_nodes(THREE, 0, {1: _waiting(0.01), 2: reply}) == []


def test_a_node_is_slow_only_where_every_rank_on_it_answered_late():
    hosts = ["n1", "n1", "n2", "n2"]
    assert slow_nodes(hosts, 0, {1: _waiting(0.0), 2: _waiting(2.0), 3: _waiting(0.1)}) == []
    assert slow_nodes(hosts, 0, {2: _waiting(2.0), 3: _waiting(1.5)}) == \
        [{"node": "n2", "ranks": [2, 3], "seconds": 1.5}]
    assert slow_nodes(hosts, 0, {1: _waiting(0.0)}) == []  # none answered: silent, not slow


def test_a_node_whose_first_answer_crawled_in_and_the_next_is_still_on_its_way_is_slow():
    # The answers of ranks 2 and 3 share n2's link at 8 kbit/s: rank 2's after 2 s, rank
    # 3's not yet when the report is made. Neither silent nor all late: named slow.
    hosts = ["n1", "n1", "n2", "n2"]
    replies = {1: _waiting(0.0), 2: _waiting(2.0)}
    assert slow_nodes(hosts, 0, replies, {}) == \
        [{"node": "n2", "ranks": [2, 3], "seconds": 2.0, "unanswered": [3]}]
    assert silent_nodes(hosts, 0, [3], replies, {}) == []
    assert slow_nodes(hosts, 0, replies, {3: {}}) == []  # rank 3 left: not the link
    assert slow_nodes(hosts, 0, {1: _waiting(0.0), 2: _waiting(0.2)}, {}) == []  # in time


def test_a_silent_node_is_one_none_of_whose_ranks_answered_or_left():
    hosts = ["n1", "n1", "n2", "n2"]
    assert silent_nodes(hosts, 0, [2, 3], {1: _waiting(0.0)}, {}) == \
        [{"node": "n2", "ranks": [2, 3]}]
    assert silent_nodes(hosts, 0, [2, 3], {3: _waiting(4.0)}, {}) == []
    assert silent_nodes(hosts, 0, [2, 3], {}, {3: {}}) == []


def _fields(**how):
    fields = {"wait": {"what": "DDP bucket 0", "call": "Iallreduce", "channel": "DDP model #0",
                       "seq": 307},
              "reason": "timeout", "not_arrived": [], "ranks": {}, "silent_nodes": [],
              "slow_nodes": [], "different_collectives": [], "uneven": [], "stack": "  x\n"}
    return dict(fields, **how)


def test_the_report_says_every_rank_arrived_and_names_the_slow_node():
    text = wait_report_text(_fields(slow_nodes=[{"node": "n3", "ranks": [2], "seconds": 2.9}]),
                            "no progress for 10 s", True)
    assert "Every rank has reached this collective, and its data does not move" in text
    assert "Node n3 (rank 2) answered only after 2.9 s, waiting like this rank: that " \
           "node's network link carries almost nothing." in text
    partly = wait_report_text(_fields(slow_nodes=[{"node": "n2", "ranks": [2, 3],
                                                   "seconds": 2.0, "unanswered": [3]}]),
                              "no progress for 10 s", True)
    assert "Node n2 (ranks 2,3) answered only after 2 s (rank 3 not at all), waiting like " \
           "this rank" in partly
    plain = wait_report_text(_fields(), "no progress for 10 s", True)
    assert "Every rank has reached" in plain and "Node " not in plain
    # Ranks that issued different collectives are the news there, not the network.
    different = [{"rank": 1, "call": "Ibcast", "state": "waits"}]
    assert "Every rank has reached" not in wait_report_text(
        _fields(different_collectives=different), "no progress for 10 s", True)
