"""The one place that chooses the allreduce algorithm, on known layouts (no MPI, no torch)."""

import pytest

from hpcddp.env import ConfigError
from hpcddp.transport.allreduce.policy import (DEVICE, HOST, PINNED, WorldFacts, for_buffer,
                                              for_world, worth_trying)


def layout(nodes, per_node, uniform=True, buffers=HOST):
    return WorldFacts(nodes, per_node, uniform, buffers)


@pytest.mark.parametrize("facts, name, why", [
    (layout(1, 4), "mpi", "one node"),
    (layout(2, 2), "node", "2 nodes x 2 ranks"),
    (layout(2, 2, uniform=False), "mpi", "nodes with different numbers of ranks"),
    (layout(2, 1), "mpi", "one rank per node"),
    (layout(3, 1), "ring", "3 nodes x 1 ranks"),
    (layout(2, 2, buffers=PINNED), "mpi", "GPU buffers"),
    (layout(3, 1, buffers=DEVICE), "mpi", "one rank per node"),
])
def test_auto_takes_the_reduction_the_layout_calls_for(facts, name, why):
    choice = for_world("auto", facts)
    assert choice.name == name and why in choice.reason
    assert choice.reason.startswith("HPCDDP_REDUCE=auto: ") and facts.buffers in choice.reason


def test_auto_takes_the_ring_on_two_nodes_where_mpi_uses_links_one_way_at_a_time():
    halves = WorldFacts(2, 1, True, HOST, mpi_halves_links=True)
    choice = for_world("auto", halves)
    assert choice.name == "ring" and "OMPI_MCA_coll_libnbc_iallreduce_algorithm=1" in choice.reason
    assert for_world("auto", layout(2, 1)).name == "mpi"  # MPICH, Intel MPI: theirs is fine
    assert for_world("auto", WorldFacts(2, 1, True, PINNED, mpi_halves_links=True)).name == "mpi"
    assert for_world("auto", WorldFacts(2, 2, True, HOST, mpi_halves_links=True)).name == "node"
    assert for_world("mpi", halves).name == "mpi"  # a setting is taken as given


def test_auto_takes_the_ring_on_device_buffers_only_where_the_self_test_says_so():
    found = "Iallreduce on device buffers died of SIGSEGV, while Isend/Irecv passed"
    assert for_world("auto", layout(1, 2, buffers=DEVICE), found) == \
        ("ring", f"HPCDDP_REDUCE=auto: hpcddp's ring on device buffers (the self-test: {found})")
    assert for_world("auto", layout(1, 2, buffers=HOST), found).name == "mpi"


@pytest.mark.parametrize("setting, name", [("mpi", "mpi"), ("staged", "mpi"),
                                           ("ring", "ring"), ("node", "node")])
def test_a_setting_other_than_auto_is_taken_as_given(setting, name):
    choice = for_world(setting, layout(1, 2))
    assert choice.name == name and choice.reason.startswith(f"HPCDDP_REDUCE={setting}: ")


def test_node_aware_on_uneven_nodes_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="HPCDDP_REDUCE=node: the nodes hold different "
                                          "numbers of ranks.*HPCDDP_REDUCE=auto"):
        for_world("node", layout(2, 3, uniform=False))


def test_each_buffer_takes_the_reduction_that_suits_it():
    mib = 1 << 20
    # the node-aware allreduce only for what it cuts into more than one slice
    assert for_buffer("node", 4 * mib, 4 * mib, False, 4, half=False) == "mpi"
    assert for_buffer("node", 4 * mib + 4, 4 * mib, False, 4, half=False) == "node"
    # 16-bit floats in host memory go round the ring, which sums them with torch
    assert for_buffer("mpi", mib, 0, False, 2, half=True) == "ring"
    assert for_buffer("mpi", mib, 0, True, 2, half=True) == "mpi"    # on the device
    assert for_buffer("mpi", mib, 0, False, 1, half=True) == "mpi"   # nothing to send
    assert for_buffer("mpi", mib, 0, False, 2, half=False) == "mpi"


def test_the_autotuner_tries_what_can_run_here_the_worlds_choice_first():
    assert worth_trying("auto", "node", False, layout(2, 2)) == ("node", "mpi", "ring")
    assert worth_trying("auto", "mpi", False, layout(1, 2)) == ("mpi", "ring")
    assert worth_trying("auto", "mpi", True, layout(2, 2, buffers=DEVICE)) == ("mpi", "ring")
    assert worth_trying("auto", "ring", True, layout(1, 2, buffers=DEVICE)) == ("ring",)
    assert worth_trying("ring", "ring", False, layout(2, 2)) == ("ring",)
