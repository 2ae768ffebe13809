"""The MPI-backed torch.distributed group against gloo, run in the same job."""

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

import hpcddp

FLOAT_TOL = dict(rtol=1e-6, atol=1e-6)


def _data(world, shape=(5, 3), dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * world.rank + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def _opts(cls, **fields):
    opts = cls()
    for key, value in fields.items():
        setattr(opts, key, value)
    return opts


def test_default_group_is_hpcddp(world):
    assert dist.is_initialized() and dist.get_backend() == "hpcddp"
    assert (dist.get_rank(), dist.get_world_size()) == (world.rank, world.size)


@pytest.mark.parametrize("op, dtype", [
    (op, dtype) for op in ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]
    for dtype in [torch.float32, torch.float64, torch.int64]
    if not (op == "AVG" and dtype == torch.int64)])
def test_all_reduce_matches_gloo(world, gloo, op, dtype, device):
    ours, theirs = _data(world, dtype=dtype).to(device), _data(world, dtype=dtype).to(device)
    red = getattr(dist.ReduceOp, op)
    dist.all_reduce(ours, op=red)
    gloo.allreduce([theirs], _opts(dist.AllreduceOptions, reduceOp=red)).wait()
    torch.testing.assert_close(ours, theirs, **FLOAT_TOL)
    # Negative control: the reduction really changed something on some rank.
    before = _data(world, dtype=dtype)
    assert MPI.COMM_WORLD.allreduce(int(not torch.equal(before, ours.cpu())), op=MPI.SUM) > 0


def test_all_reduce_bf16_equals_float_sum_rounded(world):
    ours = _data(world, dtype=torch.bfloat16)
    parts = MPI.COMM_WORLD.allgather(ours.float().numpy())
    dist.all_reduce(ours)
    # MPI may combine in any order; each partial sum is rounded to bf16 once.
    expected = torch.from_numpy(sum(parts)).bfloat16()
    torch.testing.assert_close(ours.float(), expected.float(), rtol=2 ** -7, atol=1e-2)
    assert not torch.equal(ours, _data(world, dtype=torch.bfloat16))


def test_integer_average_is_refused_on_every_rank(world):
    with pytest.raises(ValueError, match="AVG needs a floating-point tensor, got torch.int64"):
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG)


def test_all_reduce_bool_is_any(world):
    flag = torch.tensor([world.rank == world.size - 1, False])
    dist.all_reduce(flag)
    assert flag.tolist() == [True, False]


def test_async_all_reduce_and_future(world, device):
    t = torch.full((4,), float(world.rank), device=device)
    work = dist.all_reduce(t, async_op=True)
    result = work.get_future().wait()
    assert work.is_completed()
    expected = float(sum(range(world.size)))
    assert torch.all(t == expected) and torch.all(result[0] == expected)


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast_matches_gloo(world, gloo, root, device):
    root = root % world.size
    ours, theirs = _data(world).to(device), _data(world).to(device)
    dist.broadcast(ours, src=root)
    gloo.broadcast([theirs], _opts(dist.BroadcastOptions, rootRank=root)).wait()
    assert torch.equal(ours, theirs)
    assert torch.equal(ours.cpu(), MPI.COMM_WORLD.bcast(_data(world), root))


def test_all_gather_list_and_into_tensor_match_gloo(world, gloo, device):
    mine = _data(world, shape=(3, 2))
    ours = [torch.empty_like(mine, device=device) for _ in range(world.size)]
    theirs = [torch.empty_like(mine) for _ in range(world.size)]
    dist.all_gather(ours, mine.to(device))
    gloo.allgather([theirs], [mine]).wait()
    assert all(torch.equal(a.cpu(), b) for a, b in zip(ours, theirs))
    flat = torch.empty((world.size * 3, 2), device=device)
    dist.all_gather_into_tensor(flat, mine.to(device))
    assert torch.equal(flat.cpu(), torch.cat(theirs))


@pytest.mark.parametrize("shapes", [[(3, 2), (4,), (1, 1, 5)], [(2,), (0,), (3,)]],
                         ids=["mixed", "with_empty"])
def test_all_gather_coalesced_matches_gloo(world, gloo, shapes):
    # torch's lists are by rank, then tensor: rank r's i-th input in outputs[r][i].
    inputs = [_data(world, shape=shape, salt=i) for i, shape in enumerate(shapes)]
    ours = [[torch.full_like(t, -1.0) for t in inputs] for _ in range(world.size)]
    theirs = [[torch.full_like(t, -1.0) for t in inputs] for _ in range(world.size)]
    dist.all_gather_coalesced(ours, inputs)
    gloo.allgather_coalesced(theirs, inputs).wait()
    everyone = MPI.COMM_WORLD.allgather([t.numpy() for t in inputs])
    for rank in range(world.size):
        for i in range(len(shapes)):
            assert torch.equal(ours[rank][i], theirs[rank][i]), (rank, i)
            assert torch.equal(ours[rank][i], torch.from_numpy(everyone[rank][i])), (rank, i)


def test_all_gather_coalesced_with_lists_of_the_wrong_shape_is_refused(world):
    inputs = [torch.ones(2), torch.ones(3)]
    wrong = [[torch.empty(2), torch.empty(3)] for _ in range(world.size + 1)]
    with pytest.raises(ValueError, match=f"one list per rank \\({world.size}\\)"):
        dist.all_gather_coalesced(wrong, inputs)


def test_all_gather_non_contiguous_output(world):
    mine = torch.full((2, 3), float(world.rank))
    outputs = [torch.empty(3, 2).t() for _ in range(world.size)]
    dist.all_gather(outputs, mine)
    assert all(torch.all(out == r) for r, out in enumerate(outputs))


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_scatter_matches_gloo(world, gloo, op, device):
    """On a GPU too: MPI's own Ireduce_scatter gets device buffers only where the
    self-test trusts its device reductions (Open MPI's libnbc sums on the host)."""
    inputs = [_data(world, shape=(4,), salt=k) for k in range(world.size)]
    ours, theirs = torch.empty(4, device=device), torch.empty(4)
    red = getattr(dist.ReduceOp, op)
    dist.reduce_scatter(ours, [t.to(device) for t in inputs], op=red)
    gloo.reduce_scatter([theirs], [inputs], _opts(dist.ReduceScatterOptions, reduceOp=red)).wait()
    torch.testing.assert_close(ours.cpu(), theirs, **FLOAT_TOL)
    single = torch.empty(4, device=device)
    dist.reduce_scatter_tensor(single, torch.cat(inputs).to(device), op=red)
    torch.testing.assert_close(single.cpu(), theirs, **FLOAT_TOL)
    # Negative control: the result is not this rank's own part.
    mine = inputs[world.rank]
    assert MPI.COMM_WORLD.allreduce(int(not torch.equal(single.cpu(), mine)), op=MPI.SUM) > 0


def test_reduce_to_root(world, gloo, device):
    ours, theirs = _data(world).to(device), _data(world)
    dist.reduce(ours, dst=0)
    gloo.reduce([theirs], _opts(dist.ReduceOptions, rootRank=0)).wait()
    if world.rank == 0:
        torch.testing.assert_close(ours.cpu(), theirs, **FLOAT_TOL)
        assert not torch.equal(ours.cpu(), _data(world)), "nothing was reduced"


def test_gather_and_scatter_match_gloo(world, gloo):
    root = world.size - 1
    mine = _data(world, shape=(2, 2))
    ours = [torch.empty(2, 2) for _ in range(world.size)] if world.rank == root else None
    dist.gather(mine, ours, dst=root)
    theirs = [torch.empty(2, 2) for _ in range(world.size)]
    gloo.gather([theirs] if world.rank == root else [], [mine],
                _opts(dist.GatherOptions, rootRank=root)).wait()
    if world.rank == root:
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    pieces = [torch.full((3,), 10.0 * r) for r in range(world.size)]
    out_ours, out_theirs = torch.empty(3), torch.empty(3)
    dist.scatter(out_ours, pieces if world.rank == root else None, src=root)
    gloo.scatter([out_theirs], [pieces] if world.rank == root else [],
                 _opts(dist.ScatterOptions, rootRank=root)).wait()
    assert torch.equal(out_ours, out_theirs) and torch.all(out_ours == 10.0 * world.rank)


def test_all_to_all_single_even_and_uneven(world, gloo):
    n = world.size
    src = torch.arange(2 * n, dtype=torch.float32) + 100 * world.rank
    ours, theirs = torch.empty(2 * n), torch.empty(2 * n)
    dist.all_to_all_single(ours, src)
    gloo.alltoall_base(theirs, src, [], [], dist.AllToAllOptions()).wait()
    assert torch.equal(ours, theirs)
    # Rank r sends r+1 rows to every peer.
    send = torch.full(((world.rank + 1) * n, 2), float(world.rank))
    recv_sizes = [r + 1 for r in range(n)]
    got = torch.empty((sum(recv_sizes), 2))
    dist.all_to_all_single(got, send, recv_sizes, [world.rank + 1] * n)
    expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(n)])
    assert torch.equal(got, expected)


def test_all_to_all_lists(world):
    n = world.size
    inputs = [torch.full((k + 1,), float(world.rank * 10 + k)) for k in range(n)]
    outputs = [torch.empty(world.rank + 1) for _ in range(n)]
    dist.all_to_all(outputs, inputs)
    for peer, out in enumerate(outputs):
        assert torch.all(out == peer * 10 + world.rank)


def test_barrier_and_send_recv_ring(world):
    dist.barrier()
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    outgoing = torch.full((3,), float(world.rank))
    incoming = torch.empty(3)
    requests = [dist.isend(outgoing, right), dist.irecv(incoming, left)]
    for request in requests:
        request.wait()
    assert torch.all(incoming == left)


def test_recv_from_any_source_reports_the_sender(world):
    if world.rank == 1:
        dist.send(torch.tensor([7.0]), 0)
    elif world.rank == 0:
        got = torch.empty(1)
        assert dist.recv(got) == 1 and got.item() == 7.0
    dist.barrier()


def test_objects_and_torch_sampler(world):
    gathered = [None] * world.size
    dist.all_gather_object(gathered, {"rank": world.rank})
    assert gathered == [{"rank": r} for r in range(world.size)]
    sampler = torch.utils.data.distributed.DistributedSampler(range(10), seed=3)
    mine = list(sampler)
    everyone = MPI.COMM_WORLD.allgather(mine)
    assert [len(part) for part in everyone] == [len(mine)] * world.size
    assert set(i for part in everyone for i in part) == set(range(10))
    # torch's sampler drew its permutation from the seed alone: every rank agrees.
    assert mine == list(sampler)


def test_subgroup(world):
    ranks = list(range(0, world.size, 2))
    group = dist.new_group(ranks)
    t = torch.tensor([float(world.rank)])
    if world.rank in ranks:
        dist.all_reduce(t, group=group)
        assert t.item() == float(sum(ranks))
    dist.destroy_process_group(group)


def test_async_all_reduce_returns_before_the_data_moves(world):
    # The last rank arrives 2 s late; the others' async call must return at once and
    # their wait() only once it has arrived, with the right sum.
    import time
    late = world.size - 1
    t = torch.full((1000,), float(world.rank + 1))
    world.comm.Barrier()
    start = time.monotonic()
    if world.rank == late:
        time.sleep(2.0)
    work = dist.all_reduce(t, async_op=True)
    returned = time.monotonic() - start
    work.wait()
    waited = time.monotonic() - start
    assert torch.all(t == sum(range(1, world.size + 1)))
    if world.rank != late:
        assert returned < 0.5, f"async all_reduce took {returned:.2f} s to return"
        assert waited >= 1.9, f"wait() returned after {waited:.2f} s, before the late rank"


def test_future_then_chains_without_a_wait(world):
    # The last rank arrives late: elsewhere the future must come back incomplete at once,
    # and complete, with its chain, without anyone calling work.wait().
    import time
    late = world.size - 1
    t = torch.full((4,), float(world.rank))
    world.comm.Barrier()
    if world.rank == late:
        time.sleep(1.0)
    start = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    returned, done_at_once = time.monotonic() - start, future.done()
    chained = future.then(lambda fut: fut.value()[0] * 2).then(lambda fut: fut.value() + 1)
    assert torch.all(chained.wait() == 2 * sum(range(world.size)) + 1)
    assert work.is_completed()
    if world.rank != late and world.size > 1:
        assert returned < 0.5 and not done_at_once, "get_future() waited for the result"


def test_wait_with_a_timeout_names_the_operation(world):
    if world.size == 1:
        pytest.skip("needs two ranks")
    from datetime import timedelta

    from hpcddp.comm import HandleTimeout
    t = torch.ones(3)
    if world.rank == 0:
        work = dist.broadcast(t, src=1, async_op=True)
        with pytest.raises(HandleTimeout, match=r"broadcast from rank 1 of 3 float32.*did not "
                                                r"complete within 0\.3 s"):
            work.wait(timeout=timedelta(seconds=0.3))
    world.comm.Barrier()  # rank 1 broadcasts only after rank 0 timed out
    if world.rank == 1:
        work = dist.broadcast(t * 5, src=1, async_op=True)
    work.wait() if world.rank in (0, 1) else dist.broadcast(t, src=1)
    if world.rank == 0:
        assert torch.all(t == 5)


def test_a_groups_timeout_ends_a_wait_as_gloos_does(world):
    # Rank 0 alone enters a barrier on a group with a 1 s timeout: its wait raises
    # DistBackendError (what gloo raises) after 1 s, and the barrier stays pending until
    # the others enter it; the job is not ended.
    group = dist.new_group(timeout=timedelta(seconds=1))
    if world.rank == 0:
        began = time.monotonic()
        work = dist.barrier(group, async_op=True)
        with pytest.raises(dist.DistBackendError,
                           match=r"within 1 s \(the process group's timeout\): Timed out "):
            work.wait()
        assert time.monotonic() - began >= 1.0
    MPI.COMM_WORLD.Barrier()
    if world.rank == 0:
        work.wait(timeout=timedelta(seconds=60))  # the others' barrier completes it
    else:
        dist.barrier(group)
    dist.destroy_process_group(group)
