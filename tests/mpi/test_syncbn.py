"""SyncBatchNorm against single-process BatchNorm on the global batch, computed on every
rank in the same job: outputs, input and parameter gradients, running statistics."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
from ddp_models import ConvBN

TOL = dict(rtol=1e-5, atol=1e-5)


def _sizes(world, kind):
    if kind == "equal":
        return [4] * world.size
    if kind == "uneven":
        return [2 + 3 * r for r in range(world.size)]
    return [0] + [5] * (world.size - 1)  # rank 0's batch is empty


def _data(world, sizes, shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((sum(sizes),) + shape, generator=g) * 3 + 1
    upstream = torch.randn((sum(sizes),) + shape, generator=g)
    start = sum(sizes[:world.rank])
    mine = slice(start, start + sizes[world.rank])
    return x, upstream, mine


@pytest.mark.parametrize("kind", ["equal", "uneven", "empty"])
@pytest.mark.parametrize("shape", [(3,), (3, 5, 5)], ids=["1d", "2d"])
def test_matches_batchnorm_on_the_global_batch(world, device, kind, shape):
    if kind == "empty" and world.size == 1:
        pytest.skip("needs two ranks")
    layer = nn.BatchNorm1d(3) if len(shape) == 1 else nn.BatchNorm2d(3)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
        layer.bias.uniform_(-1, 1, generator=torch.Generator().manual_seed(2))
    reference = copy.deepcopy(layer)
    ours = hpcddp.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(layer)).to(device)
    assert isinstance(ours, hpcddp.SyncBatchNorm)
    sizes = _sizes(world, kind)
    for step in range(2):
        x, upstream, mine = _data(world, sizes, shape, seed=10 + step)
        xg = x.clone().requires_grad_()
        full = reference(xg)
        expected = full.detach()[mine]
        (full * upstream).sum().backward()
        xl = x[mine].clone().to(device).requires_grad_()
        out = ours(xl)
        (out * upstream[mine].to(device)).sum().backward()
        torch.testing.assert_close(out.detach().cpu(), expected, **TOL)
        torch.testing.assert_close(xl.grad.cpu(), xg.grad[mine], **TOL)
    # Weight and bias gradients are local; their sum over ranks is the global gradient.
    for name in ("weight", "bias"):
        local = getattr(ours, name).grad.detach().cpu().double()
        total = sum(world.comm.allgather(local))
        torch.testing.assert_close(total.float(), getattr(reference, name).grad, **TOL)
    torch.testing.assert_close(ours.running_mean.cpu(), reference.running_mean, **TOL)
    torch.testing.assert_close(ours.running_var.cpu(), reference.running_var, **TOL)
    assert ours.num_batches_tracked.item() == reference.num_batches_tracked.item() == 2


def test_eval_mode_is_local(world):
    layer = hpcddp.SyncBatchNorm(3)
    layer.eval()
    x = torch.randn(4, 3) + world.rank
    before = world.comm.allreduce(0)
    # Ranks call it a different number of times: any collective would hang or mismatch.
    for _ in range(1 + world.rank):
        out = layer(x)
    world.comm.Barrier()
    torch.testing.assert_close(out, F.batch_norm(x, torch.zeros(3), torch.ones(3),
                                                 layer.weight, layer.bias, False, 0.1, 1e-5))
    assert before == 0


@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_inside_ddp_matches_single_process(world, broadcast_buffers):
    torch.manual_seed(0)
    net = ConvBN()
    reference = copy.deepcopy(net)
    ddp = hpcddp.DistributedDataParallel(
        hpcddp.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(net)),
        broadcast_buffers=broadcast_buffers)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ddp, reference)]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4 * world.size, 3, 8, 8, generator=g)
        y = torch.randint(0, 3, (4 * world.size,), generator=g)
        mine = slice(4 * world.rank, 4 * world.rank + 4)
        for opt in opts:
            opt.zero_grad()
        F.cross_entropy(ddp(x[mine]), y[mine]).backward()
        F.cross_entropy(reference(x), y).backward()
        for opt in opts:
            opt.step()
    for a, b in zip(ddp.module.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(ddp.module.buffers(), reference.buffers()):
        torch.testing.assert_close(a.float(), b.float(), **TOL)
