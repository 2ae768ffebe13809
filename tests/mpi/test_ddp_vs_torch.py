"""hpcddp against torch's own DDP on gloo, same job, same per-rank data.

BatchNorm normalizes each rank's batch separately, so single-process training is not the
reference for these models; torch's DDP is.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
from ddp_models import ConvBN, SometimesUnused, global_batch, share

TOL = dict(rtol=1e-5, atol=1e-6)


def _step_both(ours, theirs, opts, x, y):
    for model, opt in zip((ours, theirs), opts):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def _pair(world, gloo, make, device="cpu", **kwargs):
    torch.manual_seed(world.rank)  # different initial weights: both must broadcast rank 0's
    model = make().to(device)
    ours = hpcddp.DistributedDataParallel(copy.deepcopy(model), **kwargs)
    theirs = TorchDDP(copy.deepcopy(model), process_group=gloo, **kwargs)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, theirs)]
    return ours, theirs, opts


def test_cnn_with_batchnorm(world, gloo, device):
    ours, theirs, opts = _pair(world, gloo, ConvBN, device)
    for step in range(4):
        x, y = global_batch(step, world.size, "image")
        x, y = share(x, world.rank).to(device), share(y, world.rank).to(device)
        # Ranks see different data, so their BatchNorm statistics differ until broadcast.
        _step_both(ours, theirs, opts, x, y)
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(ours.module.buffers(), theirs.module.buffers()):
        torch.testing.assert_close(a, b, **TOL)
    # Buffers are broadcast before each forward: bitwise equal on every rank (in eval
    # mode, so that the forward itself does not update them from local data).
    ours.eval()
    with torch.no_grad():
        ours(x)
    mine = [b.cpu() for b in ours.module.buffers()]
    rank0 = world.comm.bcast(mine, root=0)
    assert all(torch.equal(a, b) for a, b in zip(mine, rank0))


def test_parameter_unused_on_some_ranks(world, gloo, device):
    ours, theirs, opts = _pair(world, gloo, lambda: SometimesUnused(world.rank), device,
                               find_unused_parameters=True)
    for step in range(3):
        x, y = global_batch(step, world.size)
        x, y = share(x, world.rank).to(device), share(y, world.rank).argmax(1).to(device)
        _step_both(ours, theirs, opts, x, y)
        # Unused on every rank: no gradient at all, as in torch.
        assert ours.module.never.weight.grad is None
        assert theirs.module.never.weight.grad is None
        torch.testing.assert_close(ours.module.extra.weight.grad,
                                   theirs.module.extra.weight.grad, **TOL)
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        torch.testing.assert_close(a, b, **TOL)


def test_negative_control_without_broadcast_buffers_differs(world, gloo):
    if world.size == 1:
        pytest.skip("needs two ranks")
    ours, theirs, opts = _pair(world, gloo, ConvBN, broadcast_buffers=False)
    x, y = global_batch(0, world.size, "image")
    _step_both(ours, theirs, opts, share(x, world.rank), share(y, world.rank))
    stats = ours.module.bn.running_mean.clone()
    others = world.comm.allgather(stats)
    assert any(not torch.equal(stats, other) for other in others)


def test_state_dict_keys_and_round_trip(world, gloo):
    ours, theirs, _ = _pair(world, gloo, ConvBN)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.module.state_dict()) == [k[len("module."):] for k in ours.state_dict()]
    MPI.COMM_WORLD.Barrier()
