"""The collective forms torch's parallelisms call (FSDP2, DTensor, pipelining), on the
hpcddp backend against gloo in the same job or a closed form: inputs aliasing outputs,
uneven parts, coalesced calls, batched point-to-point, tags, sparse tensors, and
torch's functional collectives (DTensor's path into the backend)."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from mpi4py import MPI

FLOAT_TOL = dict(rtol=1e-6, atol=1e-6)


def _data(world, n, salt=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * world.rank + salt))


def _everyone(tensor):
    return [torch.from_numpy(a) for a in MPI.COMM_WORLD.allgather(tensor.numpy())]


def test_all_gather_into_tensor_from_its_own_chunk(world):
    """FSDP2's form: the input is this rank's chunk of the output (MPI_IN_PLACE)."""
    out = torch.zeros(3 * world.size)
    mine = out[3 * world.rank:3 * world.rank + 3]
    mine.copy_(_data(world, 3))
    dist.all_gather_into_tensor(out, mine)
    assert torch.equal(out, torch.cat(_everyone(_data(world, 3))))


def test_all_gather_into_tensor_from_an_overlapping_input(world):
    """An input that overlaps the output elsewhere than its chunk is copied first."""
    out = torch.arange(3.0 * world.size) + 100 * world.rank
    src = out[1:4]
    expected = torch.cat(_everyone(src.clone()))
    dist.all_gather_into_tensor(out, src)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("op", ["SUM", "AVG"])
def test_reduce_scatter_into_its_own_input(world, gloo, op):
    red = getattr(dist.ReduceOp, op)
    inp = _data(world, 2 * world.size)
    theirs = torch.empty(2)
    gloo._reduce_scatter_base(theirs, inp.clone(), _opts(red)).wait()
    out = inp[2 * world.rank:2 * world.rank + 2]  # a view of the input
    dist.reduce_scatter_tensor(out, inp, op=red)
    torch.testing.assert_close(out, theirs, **FLOAT_TOL)


def _opts(red):
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = red
    return opts


def test_all_gather_uneven_parts(world):
    outputs = [torch.empty(r + 1, 2) for r in range(world.size)]
    dist.all_gather(outputs, torch.full((world.rank + 1, 2), float(world.rank)))
    for r, out in enumerate(outputs):
        assert torch.equal(out, torch.full((r + 1, 2), float(r)))


def test_reduce_scatter_uneven_parts(world):
    inputs = [_data(world, r + 2, salt=r) for r in range(world.size)]
    out = torch.empty(world.rank + 2)
    dist.reduce_scatter(out, inputs)
    expected = sum(_data_of(rank, world.rank + 2, world.rank) for rank in range(world.size))
    torch.testing.assert_close(out, expected, **FLOAT_TOL)


def _data_of(rank, n, salt):
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * rank + salt))


def test_coalesced_collectives_match_gloo(world, gloo):
    """FSDP's coalesced all-gather and reduce-scatter, and all_reduce_coalesced."""
    n = world.size
    shards = [_data(world, 2, salt=1), _data(world, 3, salt=2)]
    outs = [torch.empty(2 * n), torch.empty(3 * n)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, shard in zip(outs, shards):
            dist.all_gather_into_tensor(out, shard)
    cm.wait()
    for out, shard in zip(outs, shards):
        theirs = torch.empty_like(out)
        gloo._allgather_base(theirs, shard).wait()
        assert torch.equal(out, theirs)
    fulls = [_data(world, 2 * n, salt=3), _data(world, 4 * n, salt=4)]
    ours = [torch.empty(2), torch.empty(4)]
    dist.distributed_c10d._world.default_pg.reduce_scatter_tensor_coalesced(
        ours, fulls, _opts(dist.ReduceOp.SUM)).wait()
    for mine, full in zip(ours, fulls):
        theirs = torch.empty_like(mine)
        gloo._reduce_scatter_base(theirs, full.clone(), _opts(dist.ReduceOp.SUM)).wait()
        torch.testing.assert_close(mine, theirs, **FLOAT_TOL)
    many = [_data(world, 3, salt=5), _data(world, 5, salt=6)]
    expected = [t.clone() for t in many]
    dist.all_reduce_coalesced(many)
    for t in expected:
        gloo.allreduce([t]).wait()
    for mine, theirs in zip(many, expected):
        torch.testing.assert_close(mine, theirs, **FLOAT_TOL)


def test_functional_collectives_match_gloo(world, gloo):
    """DTensor's collectives, which reach the backend from C++."""
    x = _data(world, 4 * world.size)
    theirs = x.clone()
    gloo.allreduce([theirs]).wait()
    torch.testing.assert_close(funcol.all_reduce(x, "sum", dist.group.WORLD).wait(),
                               theirs, **FLOAT_TOL)
    gathered = funcol.all_gather_tensor(x, 0, dist.group.WORLD).wait()
    assert torch.equal(gathered, torch.cat(_everyone(x)))
    scattered = funcol.reduce_scatter_tensor(x, "sum", 0, dist.group.WORLD).wait()
    mine = torch.empty(4)
    gloo._reduce_scatter_base(mine, x.clone(), _opts(dist.ReduceOp.SUM)).wait()
    torch.testing.assert_close(scattered, mine, **FLOAT_TOL)
    swapped = funcol.all_to_all_single(x, None, None, dist.group.WORLD).wait()
    theirs = torch.empty_like(x)
    gloo.alltoall_base(theirs, x, [], [], dist.AllToAllOptions()).wait()
    assert torch.equal(swapped, theirs)


def test_batch_isend_irecv_both_ways_round_the_ring(world):
    n, r = world.size, world.rank
    right, left = (r + 1) % n, (r - 1) % n
    from_left, from_right = torch.empty(3), torch.empty(3)
    ops = [dist.P2POp(dist.isend, torch.full((3,), r + 0.5), right),
           dist.P2POp(dist.isend, torch.full((3,), -r - 0.5), left),
           dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.irecv, from_right, right)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    assert torch.all(from_left == left + 0.5) and torch.all(from_right == -right - 0.5)


def test_tags_match_sends_to_receives(world):
    if world.rank == 0:
        for peer in range(1, world.size):
            dist.send(torch.ones(2), peer, tag=7)
            dist.send(torch.full((2,), 2.0), peer, tag=3)
    else:
        second, first = torch.empty(2), torch.empty(2)
        dist.recv(first, 0, tag=3)  # sent second, received first: matched by tag
        dist.recv(second, 0, tag=7)
        assert torch.all(first == 2.0) and torch.all(second == 1.0)
    dist.barrier()


def test_a_tag_beyond_the_mpi_limit_is_refused(world):
    ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    with pytest.raises(ValueError, match=f"tag={ub + 1}: this MPI's tags run from 0 to {ub}"):
        dist.send(torch.ones(1), (world.rank + 1) % world.size, tag=ub + 1)


def test_sparse_all_reduce_matches_gloo(world, gloo):
    rows = torch.tensor([[world.rank % 3, 4]])
    ours = torch.sparse_coo_tensor(rows, torch.ones(2, 2) * (world.rank + 1), (5, 2),
                                   check_invariants=True)
    theirs = ours.clone()
    dist.all_reduce(ours)
    gloo.allreduce([theirs]).wait()
    torch.testing.assert_close(ours.to_dense(), theirs.to_dense())
    assert ours.to_dense()[4].sum() == 2 * sum(range(1, world.size + 1))


def test_premul_sum_is_refused_with_its_name(world):
    with pytest.raises(ValueError, match="reduce op PREMUL_SUM is not supported by the hpcddp"):
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))


def test_a_whole_of_the_wrong_size_is_refused_with_the_sizes(world):
    with pytest.raises(ValueError, match=f"all_gather_into_tensor: the output must hold the "
                                         f"group's {world.size} ranks' inputs of 2 float32"):
        dist.all_gather_into_tensor(torch.empty(2 * world.size + 1), torch.ones(2))
    with pytest.raises(ValueError, match=f"has {2 * world.size - 1} float32"):
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world.size - 1))
