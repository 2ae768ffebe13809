"""Which side of a split job goes on (hpcddp.elastic.quorum): for every way of cutting a
job's nodes in two, exactly one side goes on, and ranks lost while others of their node
live never stop the survivors."""

import itertools

import pytest

from hpcddp.elastic.quorum import holds_quorum


def _job(layout):
    """hosts[r] for a job of ``layout`` = ranks per node, filled node by node."""
    return [f"n{i}" for i, count in enumerate(layout) for _ in range(count)]


def _ranks_on(hosts, nodes):
    return [r for r, h in enumerate(hosts) if h in nodes]


@pytest.mark.parametrize("layout", [(2, 2), (1, 1, 1), (1, 1, 1, 1), (2, 1, 3), (4,) * 5])
def test_of_the_two_sides_of_any_cut_exactly_one_goes_on(layout):
    hosts = _job(layout)
    nodes = sorted(set(hosts))
    for k in range(1, len(nodes)):
        for side in itertools.combinations(nodes, k):
            other = [n for n in nodes if n not in side]
            on = [holds_quorum(hosts, _ranks_on(hosts, part)) for part in (side, other)]
            assert sorted(on) == [False, True], (layout, side, on)


def test_half_of_the_nodes_goes_on_only_with_rank_0s():
    hosts = _job((2, 2))
    assert holds_quorum(hosts, [0, 1]) and not holds_quorum(hosts, [2, 3])
    hosts = _job((1, 1, 1, 1))
    assert holds_quorum(hosts, [0, 3]) and not holds_quorum(hosts, [1, 2])


def test_ranks_lost_beside_survivors_of_their_node_split_nothing():
    hosts = _job((2, 2))
    assert holds_quorum(hosts, [1, 3])      # ranks 0 and 2 died, each node still held
    assert holds_quorum(_job((4,)), [3])    # one node: three of four ranks lost


def test_a_smaller_side_stops_however_many_ranks_it_has():
    hosts = _job((6, 1, 1))                 # the most ranks, on one node of three
    assert not holds_quorum(hosts, _ranks_on(hosts, ["n0"]))
    assert holds_quorum(hosts, _ranks_on(hosts, ["n1", "n2"]))
