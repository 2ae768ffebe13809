"""Communication hooks: torch's own hooks over hpcddp's DDP and group, against torch's DDP
on gloo with the same hook, in the same job and on the same per-rank data."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as local_sgd
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
import hpcddp.checkpoint
from ddp_models import MLP, global_batch, share
from gloo_group import make_single_rank_gloo_group

STEPS = 5


class Wide(nn.Module):
    """Matrices PowerSGD compresses (32x32 at rank 1), biases it sends as they are."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 32)
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))))


def _train(model, opt, world, steps=STEPS, device="cpu"):
    for step in range(steps):
        x, y = global_batch(step, world.size)
        opt.zero_grad()
        F.mse_loss(model(share(x, world.rank).to(device)),
                   share(y, world.rank).to(device)).backward()
        opt.step()


def _both(world, gloo, make_state, hook, make=Wide, tol=None, **kwargs):
    """Train hpcddp's DDP (state on the hpcddp group) and torch's (state on gloo) with the
    same hook; return both models."""
    torch.manual_seed(world.rank)
    model = make()
    ours = hpcddp.DistributedDataParallel(copy.deepcopy(model), **kwargs)
    theirs = TorchDDP(copy.deepcopy(model), process_group=gloo, **kwargs)
    ours.register_comm_hook(make_state(None), hook)
    theirs.register_comm_hook(make_state(gloo), _renamed(hook))
    for ddp in (ours, theirs):
        _train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9), world)
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        torch.testing.assert_close(a, b, **(tol or dict(rtol=1e-5, atol=1e-6)))
    return ours, theirs


def _renamed(hook):
    """The same hook for torch's DDP on gloo, one bucket at a time, under another name.

    Gloo runs ``.then()`` callbacks on its worker threads, where PowerSGD's start further
    allreduces: with several buckets in flight they are issued in a different order on
    each rank, and gloo times out. Waiting inside the hook keeps one chain in flight. The
    name: torch refuses the bf16 hooks by name unless NCCL is there, though gloo sums
    bfloat16 on the CPU.
    """
    def reference_hook(state, bucket):
        future = hook(state, bucket)
        future.wait()
        return future
    return reference_hook


CAP = dict(bucket_cap_mb=0.005)  # several buckets


@pytest.mark.parametrize("hook", [default_hooks.allreduce_hook, default_hooks.fp16_compress_hook,
                                  default_hooks.bf16_compress_hook],
                         ids=["allreduce", "fp16", "bf16"])
def test_default_hooks_match_torch(world, gloo, hook):
    tol = None if hook is default_hooks.allreduce_hook else dict(rtol=1e-2, atol=1e-3)
    _both(world, gloo, lambda group: group, hook, tol=tol, **CAP)


def _powersgd_state(**kwargs):
    def make(group):
        return psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                  start_powerSGD_iter=2, min_compression_rate=0.5,
                                  random_seed=7, **kwargs)
    return make


@pytest.mark.parametrize("hook", [psgd.powerSGD_hook,
                                  default_hooks.fp16_compress_wrapper(psgd.powerSGD_hook),
                                  default_hooks.bf16_compress_wrapper(psgd.powerSGD_hook)],
                         ids=["powerSGD", "fp16-wrapped", "bf16-wrapped"])
def test_powersgd_matches_torch(world, gloo, hook):
    wrapped = hook.__name__.endswith("wrapper_hook")
    tol = dict(rtol=1e-2, atol=1e-3) if wrapped else dict(rtol=1e-4, atol=1e-5)
    ours, _ = _both(world, gloo, _powersgd_state(), hook, tol=tol, **CAP)
    state = ours.reducer.hook_state
    assert state.iter == STEPS and state.error_dict, "PowerSGD never compressed"


def test_batched_powersgd_fails_as_in_torch(world, gloo):
    """torch 2.13's batched_powerSGD_hook hands a 2-D matrix to ``_orthogonalize``, which
    asserts a batch of them, on its first compressed step, on any backend. hpcddp gives
    the same error at the same step, on every rank, and nothing hangs."""
    torch.manual_seed(world.rank)
    model = Wide()
    for ddp, group in [(hpcddp.DistributedDataParallel(copy.deepcopy(model)), None),
                       (TorchDDP(copy.deepcopy(model), process_group=gloo), gloo)]:
        ddp.register_comm_hook(_powersgd_state()(group), psgd.batched_powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        _train(ddp, opt, world, steps=2)  # vanilla allreduce before start_powerSGD_iter
        with pytest.raises(AssertionError):
            _train(ddp, opt, world, steps=1)


def test_powersgd_with_gradient_as_bucket_view(world, gloo):
    _both(world, gloo, _powersgd_state(), psgd.powerSGD_hook, gradient_as_bucket_view=True,
          tol=dict(rtol=1e-4, atol=1e-5), **CAP)


def test_post_local_sgd_matches_torch(world, gloo):
    """Global allreduce for two steps, then each subgroup of one rank: local SGD."""
    ours_sub = dist.new_subgroups(group_size=1)[0]
    gloo_sub = make_single_rank_gloo_group()

    def make(group):
        return local_sgd.PostLocalSGDState(process_group=group,
                                           subgroup=ours_sub if group is None else gloo_sub[0],
                                           start_localSGD_iter=2)
    ours, theirs = _both(world, gloo, make, local_sgd.post_localSGD_hook, **CAP)
    if world.size > 1:
        # Local steps on different data: the replicas have drifted apart.
        mine = torch.cat([p.detach().reshape(-1) for p in ours.module.parameters()])
        assert not torch.equal(mine, world.comm.bcast(mine, root=0)) or world.rank == 0


def test_hook_collective_starts_during_backward(world):
    """Overlap is kept: the hook's allreduce is issued before the last gradient hook."""
    ddp = hpcddp.DistributedDataParallel(MLP(width=64, depth=4), bucket_cap_mb=0.01)
    events = []

    def hook(state, bucket):
        events.append("comm hook")
        return default_hooks.allreduce_hook(state, bucket)
    ddp.register_comm_hook(None, hook)
    # Each runs after DDP's own hook on its parameter, which may launch a bucket.
    handles = [p.register_post_accumulate_grad_hook(lambda _: events.append("gradient"))
               for p in ddp.parameters()]
    x, y = global_batch(0, world.size)
    F.mse_loss(ddp(share(x, world.rank)), share(y, world.rank)).backward()
    for handle in handles:
        handle.remove()
    last_gradient = max(i for i, event in enumerate(events) if event == "gradient")
    assert len(ddp.reducer.buckets) > 2 and events.index("comm hook") < last_gradient


def test_hpcddp_compression_matches_torch_fp16_hook(world, gloo):
    """hpcddp's in-transport fp16 gives what torch's fp16_compress_hook gives on gloo."""
    torch.manual_seed(world.rank)
    model = Wide()
    ours = hpcddp.DistributedDataParallel(copy.deepcopy(model), **CAP)
    theirs = TorchDDP(copy.deepcopy(model), process_group=gloo, **CAP)
    ours.register_comm_hook(None, hpcddp.fp16_compress_hook)
    theirs.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    for ddp in (ours, theirs):
        _train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), world)
    for a, b in zip(ours.module.parameters(), theirs.module.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)
    assert all(h.dtype == torch.float16 for h in ours.reducer.hook._wire.values())


def test_hook_registered_twice_or_wrong_result_is_refused(world):
    ddp = hpcddp.DistributedDataParallel(MLP())
    ddp.register_comm_hook(None, lambda state, bucket: 42)
    with pytest.raises(RuntimeError, match="only be called once"):
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    x, y = global_batch(0, world.size)
    with pytest.raises(TypeError, match="returned int"):
        F.mse_loss(ddp(share(x, world.rank)), share(y, world.rank)).backward()


def _powersgd_run(world, directory, save_at=None, load=False, restore_hook=True, steps=6):
    torch.manual_seed(0)
    ddp = hpcddp.DistributedDataParallel(Wide(), **CAP)
    state = _powersgd_state()(None)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    start = 0
    if load:
        resumed = hpcddp.checkpoint.load(directory, ddp, opt)
        start = resumed.step
        if not restore_hook:  # the negative control: a fresh hook state
            state.error_dict.clear(), state.p_memory_dict.clear(), state.q_memory_dict.clear()
            state.iter = start
    for step in range(start, steps):
        x, y = global_batch(step, world.size)
        opt.zero_grad()
        F.mse_loss(ddp(share(x, world.rank)), share(y, world.rank)).backward()
        opt.step()
        if save_at == step + 1:
            hpcddp.checkpoint.save(directory, ddp, opt, step=step + 1)
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


def test_powersgd_state_survives_a_checkpoint(world, tmp_path_factory):
    directory = world.comm.bcast(str(tmp_path_factory.mktemp("psgd")) if world.rank == 0
                                 else None, root=0)
    uninterrupted = _powersgd_run(world, directory, save_at=4)
    resumed = _powersgd_run(world, directory, load=True)
    assert torch.equal(resumed, uninterrupted)
    forgetful = _powersgd_run(world, directory, load=True, restore_hook=False)
    assert not torch.equal(forgetful, uninterrupted)  # the error feedback mattered
