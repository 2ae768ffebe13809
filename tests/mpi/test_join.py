"""Uneven inputs under Join: hpcddp's DDP against torch's DDP on gloo with the same
uneven data, in the same job."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
from ddp_models import ConvBN, MLP, global_batch, share

TOL = dict(rtol=1e-5, atol=1e-6)


def _batches(world, kind="dense"):
    """Rank r has 2 + 2r batches (rank 0 runs out first); the last rank has a step more
    under 3 ranks, so two ranks join at different times."""
    out = []
    for step in range(2 + 2 * world.rank):
        x, y = global_batch(step, world.size, kind)
        out.append((share(x, world.rank), share(y, world.rank)))
    return out


def _train(model, world, loss, kind="dense", **join_kwargs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with model.join(**join_kwargs):
        for x, y in _batches(world, kind):
            opt.zero_grad()
            loss(model(x), y).backward()
            opt.step()
    return opt


def _pair(world, gloo, make, **kwargs):
    torch.manual_seed(world.rank)
    model = make()
    return (hpcddp.DistributedDataParallel(copy.deepcopy(model), **kwargs),
            TorchDDP(copy.deepcopy(model), process_group=gloo, **kwargs))


def _same(ours, theirs):
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(ours.module.buffers(), theirs.module.buffers()):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("solo_kb", ["1024", "1"], ids=["buckets", "solo-weights"])
@pytest.mark.parametrize("divide", [True, False], ids=["initial-world", "effective-world"])
def test_join_matches_torch(world, gloo, divide, solo_kb, monkeypatch):
    # With 1 KiB, each weight is reduced in its own gradient, and a joined rank's
    # shadow of it is a zero buffer.
    monkeypatch.setenv("HPCDDP_SOLO_BUCKET_KB", solo_kb)
    ours, theirs = _pair(world, gloo, lambda: MLP(width=32), bucket_cap_mb=0.002)
    assert any(b.layout.solo for b in ours.reducer.buckets) == (solo_kb == "1")
    for ddp in (ours, theirs):
        _train(ddp, world, F.mse_loss, divide_by_initial_world_size=divide)
    _same(ours, theirs)
    # Every rank ends with the model of the last to join.
    mine = torch.cat([p.detach().reshape(-1) for p in ours.parameters()])
    assert torch.equal(mine, world.comm.bcast(mine, root=world.size - 1))


def test_join_with_buffers_and_torch_join_class(world, gloo):
    """BatchNorm buffers come from a rank still training; torch's Join class works too."""
    ours, theirs = _pair(world, gloo, ConvBN)
    for ddp in (ours, theirs):
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        with Join([ddp]):
            for x, y in _batches(world, "image"):
                opt.zero_grad()
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
    _same(ours, theirs)


def test_join_with_a_comm_hook(world, gloo):
    ours, theirs = _pair(world, gloo, lambda: MLP(width=32), bucket_cap_mb=0.002)
    ours.register_comm_hook(None, default_hooks.allreduce_hook)
    theirs.register_comm_hook(gloo, default_hooks.allreduce_hook)
    for ddp in (ours, theirs):
        _train(ddp, world, F.mse_loss)
    _same(ours, theirs)


def test_join_with_no_sync_steps(world, gloo):
    """Gradient accumulation under Join: joined ranks mirror only synchronized steps."""
    ours, theirs = _pair(world, gloo, MLP)
    for ddp in (ours, theirs):
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        with ddp.join():
            for step, (x, y) in enumerate(_batches(world)):
                if step % 2 == 0:
                    with ddp.no_sync():
                        F.mse_loss(ddp(x), y).backward()
                    continue
                F.mse_loss(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()
    _same(ours, theirs)


def test_throw_on_early_termination(world):
    if world.size == 1:
        pytest.skip("needs two ranks")
    ddp = hpcddp.DistributedDataParallel(MLP())
    with pytest.raises(RuntimeError, match="exhausted"):
        _train(ddp, world, F.mse_loss, throw_on_early_termination=True)
    # Every rank raised and the job goes on: the same wrapper still trains in step.
    x, y = global_batch(0, world.size)
    F.mse_loss(ddp(share(x, world.rank)), share(y, world.rank)).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
    assert torch.equal(grads, world.comm.bcast(grads, root=0))


def test_join_needs_a_torch_group(world):
    ddp = hpcddp.DistributedDataParallel(MLP(), process_group=world.comm)
    with pytest.raises(TypeError, match="torch.distributed group"):
        ddp.join()


def test_torch_join_and_torch_ddp_over_the_hpcddp_group(world):
    """torch's own Join machinery on the hpcddp backend: its allreduces count the ranks
    still training, and torch's DDP on the hpcddp group finishes uneven inputs."""
    torch.manual_seed(world.rank)
    model = TorchDDP(MLP())  # the default group: hpcddp's
    _train(model, world, F.mse_loss)
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(mine, world.comm.bcast(mine, root=0))
