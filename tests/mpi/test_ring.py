"""hpcddp's ring allreduce on host buffers, against the sum of every rank's values.

The reference is computed independently: each rank's tensor gathered and summed in
float64 by NumPy. Sizes cover empty buffers, fewer elements than ranks, remainders,
and many slices (a 64-byte slice makes every ring tiny).
"""

import threading

import numpy as np
import pytest
import torch

from hpcddp.comm.owner import OWNER
from hpcddp.transport import Transport

SIZES = [0, 1, 2, 3, 5, 17, 100, 1031]


@pytest.fixture(scope="module")
def ring(world):
    transport = Transport(world.comm, reduction="ring")
    transport.reduction.slice_bytes = 64
    return transport


def _values(world, n, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * world.rank + n + salt)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 4).to(dtype)
    return torch.randint(-100, 100, (n,), generator=g).to(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12),
                                        (torch.int64, 0), (torch.float16, 2e-2),
                                        (torch.bfloat16, 5e-2)])
def test_ring_sum_equals_the_sum_of_every_rank(world, ring, n, dtype, tol):
    mine = _values(world, n, dtype)
    expected = sum(np.asarray(v, dtype=np.float64) for v in
                   world.comm.allgather(mine.double().numpy()))
    result = ring.allreduce(mine.clone(), slot=0).wait()
    np.testing.assert_allclose(result.double().numpy(), expected, rtol=tol, atol=tol * 8)
    if n and world.size > 1:  # negative control: the ring changed something somewhere
        assert world.comm.allreduce(int(not torch.equal(result, mine))) > 0


@pytest.mark.parametrize("op, combine", [("max", np.maximum), ("min", np.minimum),
                                         ("product", np.multiply)])
def test_ring_other_reductions(world, ring, op, combine):
    mine = _values(world, 37, torch.float64, salt=3) / 4
    everyone = world.comm.allgather(mine.numpy())
    expected = everyone[0]
    for other in everyone[1:]:
        expected = combine(expected, other)
    np.testing.assert_allclose(ring.allreduce(mine, op=op).wait().numpy(), expected, rtol=1e-12)


def test_ring_of_bools_is_any(world, ring):
    flags = torch.tensor([world.rank == world.size - 1, False, True])
    assert ring.allreduce(flags).wait().tolist() == [True, False, True]


def test_rings_in_flight_together_do_not_mix(world, ring):
    # Several rings (different slots and one-offs) progressed together, in start order.
    tensors = [_values(world, n, torch.float64, salt=k) for k, n in enumerate((9, 300, 1, 64))]
    expected = [sum(world.comm.allgather(t.numpy())) for t in tensors]
    transfers = [ring.allreduce(t, slot=k if k % 2 else None) for k, t in enumerate(tensors)]
    for transfer in reversed(transfers):
        transfer.test()
    for transfer, want in zip(transfers, expected):
        np.testing.assert_allclose(transfer.wait().numpy(), want, rtol=1e-12)



def test_a_wait_on_a_ring_is_handed_to_the_mpi_thread_whole(world, ring, monkeypatch):
    """The waiting thread sleeps while hpcddp's MPI thread runs the ring's steps: it hands
    over no Isend, Irecv or Test of its own. Each was a hand-over when the waiting thread
    polled the ring, and on 4 nodes x 1 rank (MPICH, 1 Gbit/s) a 16 MiB ring moved 0.35
    of the link instead of 0.83 (benchmarks/bench_network.py)."""
    if OWNER.thread is None:
        pytest.skip("MPI runs below MPI_THREAD_SERIALIZED here: hpcddp has no MPI thread")
    mine = _values(world, 1031, torch.float64)
    expected = sum(world.comm.allgather(mine.numpy()))
    handed = []
    call = OWNER.call

    def counted(fn, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            handed.append(getattr(fn, "__name__", repr(fn)))
        return call(fn, *args, **kwargs)
    handle = ring.allreduce(mine.clone(), slot=0)  # 64-byte slices: hundreds of steps
    monkeypatch.setattr(OWNER, "call", counted)
    result = handle.wait()
    monkeypatch.undo()
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, atol=1e-9)
    assert handed == [], f"the waiting thread handed over {len(handed)} calls: {handed[:8]}"


def test_ddp_and_the_torch_group_reduce_as_the_world_decided(world):
    # Under HPCDDP_REDUCE=ring (make test-mpi's second pass) this is the ring; left to
    # itself, node-aware with several ranks on each of several nodes, the ring with one
    # rank on each of three nodes or more, else MPI's.
    import os
    import socket
    from collections import Counter

    import torch.distributed as dist
    from torch import nn

    import hpcddp
    from hpcddp.backend.process_group import MPIProcessGroup
    setting = os.environ.get("HPCDDP_REDUCE", "").lower()
    per_node = Counter(world.comm.allgather(socket.gethostname())).values()
    spread = len(per_node) > 1 and min(per_node) > 1 and len(set(per_node)) == 1
    alone = len(per_node) > 2 and max(per_node) == 1
    expected = setting if setting in ("ring", "node") else "node" if spread else \
        "ring" if alone else "mpi"
    assert world.reduction == expected
    with hpcddp.DistributedDataParallel(nn.Linear(2, 2)) as ddp:
        assert ddp.reducer.transport.reduction.name == expected
    group = dist.group.WORLD
    backend = group if isinstance(group, MPIProcessGroup) else group._get_backend(
        torch.device("cpu"))
    assert backend.transport.reduction.name == expected


class _LateEvent:
    """A stand-in CUDA event that completes on its third query, as a sum on a busy
    stream would."""

    def __init__(self, log):
        self.log, self.queries = log, 0

    def record(self, stream):
        self.log.append("sum recorded")

    def query(self):
        self.queries += 1
        return self.queries >= 3

    def synchronize(self):
        self.queries = 3


class _SumStream:
    """Stands for the GPU stream the sums run on (the data here stay on the CPU)."""

    def __init__(self):
        self.log = []

    def Event(self):  # noqa: N802 - torch.cuda's name
        return _LateEvent(self.log)

    def stream(self, stream):
        from contextlib import nullcontext
        self.log.append("sum queued")
        return nullcontext()


def test_a_chunk_is_sent_on_only_after_its_sum_has_completed(world):
    # On a GPU each sum is queued on a stream; the ring must not send the reduced chunk
    # before the event after that sum completes, or it would send stale data.
    if world.size == 1:
        pytest.skip("a ring of one rank has no steps")
    from hpcddp.transport.allreduce.ring import Ring, ScratchPool
    cuda = _SumStream()
    data = _values(world, 40, torch.float64, salt=9)
    expected = sum(world.comm.allgather(data.numpy()))
    pool = ScratchPool(Ring.chunk_elements(world.size, 1 << 20, 8), torch.float64, "cpu")
    ring = Ring(world.comm, data, "sum", 77, pool, 1 << 20, cuda)
    ring.stream = "the sums' stream"  # as for CUDA data: sums go through events
    polls = 0
    while not ring.Test():
        polls += 1
    np.testing.assert_allclose(data.numpy(), expected, rtol=1e-12)
    assert cuda.log.count("sum queued") == cuda.log.count("sum recorded") == world.size - 1
    assert polls >= 2 * (world.size - 1), "each sum's event was waited for, not assumed"


@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_rings_sharing_little_scratch_all_finish_however_each_rank_tests_them(world, chunks):
    # Many rings of many slices share a pool of a few chunks, and each rank tests them in
    # an order of its own, as ranks whose gradients arrive in different orders do. The
    # pool hands chunks out in the rings' start order on every rank, so no rank can hold
    # the chunks another's oldest slice waits for: all finish, with the right sums, and
    # no more scratch than the pool's is ever made.
    if world.size == 1:
        pytest.skip("a ring of one rank has no steps")
    from hpcddp.transport.allreduce.ring import Ring, ScratchPool
    slice_bytes = 64  # 16 floats a slice: a ring of 100 floats has 7 slices
    pool = ScratchPool(Ring.chunk_elements(world.size, slice_bytes, 4), torch.float32, "cpu",
                       chunks=chunks)
    sizes = [100, 7, 333, 48, 1, 250]
    data = [_values(world, n, torch.float32, salt=k) for k, n in enumerate(sizes)]
    expected = [sum(world.comm.allgather(d.numpy())) for d in data]
    tag, rings = 500, []
    for d in data:
        rings.append(Ring(world.comm, d, "sum", tag, pool, slice_bytes))
        tag += Ring.slice_count(d.numel(), slice_bytes, 4)
    order = np.random.default_rng(world.rank).permutation(len(rings))
    pending = list(order)
    while pending:
        pending = [k for k in pending if not rings[k].Test()]
    for d, e in zip(data, expected):
        np.testing.assert_allclose(d.numpy(), e, rtol=1e-5, atol=1e-5)
    assert pool.made <= chunks
