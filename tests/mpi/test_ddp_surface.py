"""The rest of the torch DDP surface a script touches: static_graph, sparse gradients,
autocast with GradScaler and clipping. Against torch's DDP on gloo or single-process
training on the global batch, in the same job."""

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

import hpcddp
from ddp_models import MLP, global_batch, share

TOL = dict(rtol=1e-5, atol=1e-6)


class StaticWithUnused(nn.Module):
    """``never`` takes no part; ``mid`` runs twice, each time under reentrant
    checkpointing, so its parameters' hooks fire twice per backward."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.mid = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.never = nn.Linear(8, 3)

    def forward(self, x):
        h = checkpoint(self.mid, torch.tanh(self.first(x)), use_reentrant=True)
        return self.head(checkpoint(self.mid, h, use_reentrant=True))


def _compare(world, gloo, make, kind="dense", loss=F.mse_loss, steps=4, sparse=False,
             **kwargs):
    torch.manual_seed(world.rank)
    model = make()
    ours = hpcddp.DistributedDataParallel(copy.deepcopy(model), **kwargs)
    theirs = TorchDDP(copy.deepcopy(model), process_group=gloo, **kwargs)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    for step in range(steps):
        x, y = global_batch(step, world.size, kind)
        x, y = share(x, world.rank), share(y, world.rank)
        if kind == "dense":
            x = x.requires_grad_()  # reentrant checkpointing needs an input that does
        for model_, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss(model_(x), y).backward()
        for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
            assert (a.grad is None) == (b.grad is None)
            if a.grad is not None:
                assert a.grad.is_sparse == b.grad.is_sparse
                torch.testing.assert_close(a.grad.to_dense() if sparse else a.grad,
                                           b.grad.to_dense() if sparse else b.grad, **TOL)
        for opt in opts:
            opt.step()
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        torch.testing.assert_close(a, b, **TOL)
    return ours


def test_static_graph_with_a_parameter_never_used_and_reentrant_checkpointing(world, gloo):
    ours = _compare(world, gloo, StaticWithUnused, static_graph=True)
    assert ours.module.never.weight.grad is None
    assert ours.reducer._expected.max() == 2  # checkpointed parameters fire twice


class SparseEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8, sparse=True)
        self.out = nn.Linear(8, 10)

    def forward(self, tokens):
        return self.out(self.embed(tokens))


def test_sparse_gradients_reduced_as_torch(world, gloo):
    ours = _compare(world, gloo, SparseEmbedding, kind="tokens", loss=F.cross_entropy,
                    sparse=True)
    assert ours.module.embed.weight.grad.is_sparse
    assert not any(b.storage.numel() >= 50 * 8 for b in ours.reducer.buckets)


def test_autocast_gradscaler_and_clipping_match_single_process(world):
    torch.manual_seed(0)
    model = MLP(width=32)
    reference = copy.deepcopy(model)
    ddp = hpcddp.DistributedDataParallel(copy.deepcopy(model))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ddp, reference)]
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) for _ in range(2)]
    for step in range(4):
        x, y = global_batch(step, world.size)
        batches = [(share(x, world.rank), share(y, world.rank)), (x, y)]
        for m, opt, scaler, (xb, yb) in zip((ddp, reference), opts, scalers, batches):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.mse_loss(m(xb).float(), yb)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=0.05)
            scaler.step(opt)
            scaler.update()
    for a, b in zip(ddp.module.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    assert scalers[0].get_scale() == scalers[1].get_scale()
