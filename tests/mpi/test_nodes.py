"""What only ranks on several nodes can show (``make test-cluster`` runs these on an
emulated cluster; on one node they skip). Traffic is read from each node's own network
counters, an account kept by the kernel, not by hpcddp."""

import os

import pytest
import torch
from torch import nn

import hpcddp
import hpcddp.checkpoint as checkpoint
from hpcddp.checkpoint import store


@pytest.fixture(autouse=True)
def several_nodes(world):
    if world.num_nodes < 2:
        pytest.skip("needs ranks on at least 2 nodes: run `make test-cluster` (root)")


def _received_bytes() -> int:
    """Bytes this node's interfaces received, other than loopback (its network namespace)."""
    total = 0
    with open("/proc/self/net/dev") as f:
        for line in f.readlines()[2:]:
            name, fields = line.split(":", 1)
            if name.strip() != "lo":
                total += int(fields.split()[0])
    return total


def _wide_model():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def test_checkpoint_crosses_to_each_node_once(world, folder):
    model = hpcddp.DistributedDataParallel(_wide_model())
    path = checkpoint.save(folder, model, step=7)
    size = world.comm.bcast(os.path.getsize(os.path.join(path, store.STATE))
                            if world.rank == 0 else None, root=0)
    fresh = hpcddp.DistributedDataParallel(nn.Sequential(
        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)))
    world.comm.Barrier()
    before = _received_bytes()
    assert checkpoint.load(folder, fresh).step == 7
    world.comm.Barrier()
    received = _received_bytes() - before
    # Every rank's state equals the file's, read by torch itself.
    reference = torch.load(os.path.join(path, store.STATE), weights_only=True)["model"]
    for key, value in fresh.module.state_dict().items():
        assert torch.equal(value, reference[key]), key
    # A node other than rank 0's received the bytes once: not once per rank on it, and
    # the ranks of rank 0's node read rank 0's copy without any traffic. From 8 nodes
    # on, MPICH broadcasts a large message as a scatter, then an allgather around all of
    # them: rank 0's node is sent its own pieces back (less than the whole), and a node
    # may get up to half the bytes twice.
    many = world.num_nodes >= 8
    if world.node_rank == 0:
        assert received < (size if many else size / 4), (received, size)
    else:
        assert size <= received < (2 if many else 1.5) * size, (received, size,
                                                                 world.local_size)


def test_node_numbering_follows_the_hosts(world):
    hosts = world.comm.allgather(world.hostname)
    leaders = world.comm.allgather(world.local_rank == 0)
    assert hosts.count(world.hostname) == world.local_size
    order = [hosts[r] for r in range(world.size) if leaders[r]]
    assert order.index(world.hostname) == world.node_rank
    assert world.num_nodes == len(set(hosts)) == len(order)
