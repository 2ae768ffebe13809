"""The node-aware allreduce (within the node, across nodes, within the node) on host
buffers, against every rank's values gathered and combined by NumPy in float64.

On one node only its node stages run; across emulated nodes (``make test-cluster``,
two nodes x two ranks) all three do. Many buffers are in flight at once, started in
the same order on every rank and completed in any order, as DDP's buckets are.
"""

import numpy as np
import pytest
import torch

from hpcddp.transport import Transport

SIZES = [0, 1, 2, 3, 5, 17, 100, 1031, 7_001]


@pytest.fixture(scope="module")
def node(world):
    transport = Transport(world.comm, reduction="node")
    assert transport.reduction.name == "node"
    # Many slices in flight through the stages; a buffer of one slice or less (here up to
    # 64 bytes: the smallest sizes) goes to MPI's Iallreduce.
    transport.reduction.slice_bytes = 64
    yield transport
    transport.close()


def _values(world, n, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * world.rank + n + salt)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 4).to(dtype)
    return torch.randint(-100, 100, (n,), generator=g).to(dtype)


def _expected(world, mine, op):
    every = np.stack([np.asarray(v, dtype=np.float64) for v in
                      world.comm.allgather(mine.double().numpy())])
    return {"sum": every.sum(0), "max": every.max(0), "min": every.min(0)}[op]


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12),
                                        (torch.int64, 0), (torch.bfloat16, 5e-2)])
def test_many_buffers_in_flight_equal_numpy(world, node, dtype, tol, op):
    mine = [_values(world, n, dtype, salt=k) for k, n in enumerate(SIZES)]
    expected = [_expected(world, m, op) for m in mine]
    # All started before any is waited for, and waited for last to first.
    transfers = [node.allreduce(m.clone(), op=op, slot=k) for k, m in enumerate(mine)]
    results = [t.wait() for t in reversed(transfers)][::-1]
    for result, want in zip(results, expected):
        np.testing.assert_allclose(result.double().numpy(), want, rtol=tol, atol=tol * 8)


def test_a_group_with_uneven_nodes_falls_back_to_mpi(world):
    # Ranks 0..size-2: on one node, one rank fewer than the others there; across nodes of
    # two ranks each, the last node holds one. Either way: MPI's allreduce, correct.
    if world.size < 3:
        pytest.skip("needs 3 ranks or more")
    from mpi4py import MPI
    comm = world.comm.Split(0 if world.rank < world.size - 1 else MPI.UNDEFINED, world.rank)
    if comm == MPI.COMM_NULL:
        return
    transport = Transport(comm, reduction="node")
    try:
        per_node = {}
        for host in comm.allgather(world.hostname):
            per_node[host] = per_node.get(host, 0) + 1
        uneven = len(set(per_node.values())) > 1
        assert transport.reduction.name == ("mpi" if uneven else "node")
        mine = _values(world, 33, torch.float32)
        total = sum(comm.allgather(mine.double().numpy()))
        np.testing.assert_allclose(transport.allreduce(mine.clone()).wait().double().numpy(),
                                   total, rtol=1e-5)
    finally:
        transport.close()
        comm.Free()
