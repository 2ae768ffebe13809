"""torch's ZeroRedundancyOptimizer (with its state dict) and a torch.distributed.pipelining
schedule on the hpcddp backend, against single-process training of the unsplit model."""

import copy

import pytest
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch import nn

import hpcddp
from parallel_models import (
    GLOBAL_BATCH, assert_states_close, batches, full_state, loss_fn, make_net, shard_of,
    states_differ, train_single)

TOL = dict(rtol=1e-5, atol=1e-6)


def _adam(params):
    return torch.optim.Adam(params, lr=1e-2)


def _zero(model):
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                   lr=1e-2)


def _train_ddp(ddp, opt, data, world):
    for x, y in data:
        opt.zero_grad()
        loss_fn(ddp(shard_of(x, world.rank, world.size)),
                shard_of(y, world.rank, world.size)).backward()
        opt.step()


def test_zero_matches_single_process_and_its_state_dict_resumes(world):
    data = batches(steps=4)
    ref = make_net()
    ref_opt = _adam(ref.parameters())
    for step, (x, y) in enumerate(data):
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()
        ref_opt.step()
        if step == 1:
            ref_state_after_2 = copy.deepcopy(ref_opt.state_dict())
    ddp = hpcddp.DistributedDataParallel(make_net())
    opt = _zero(ddp.module)
    # Each rank keeps Adam's state for its part of the parameters only.
    _train_ddp(ddp, opt, data[:2], world)
    held = sum(p.numel() for group in opt.optim.param_groups for p in group["params"])
    assert held < sum(p.numel() for p in ddp.parameters()) or world.size == 1
    opt.consolidate_state_dict(to=0)
    if world.rank == 0:
        saved = opt.state_dict()
        for index, state in ref_state_after_2["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(saved["state"][index][key], state[key], **TOL)
    saved = world.comm.bcast(opt.state_dict() if world.rank == 0 else None, root=0)

    resumed = hpcddp.DistributedDataParallel(copy.deepcopy(ddp.module))
    opt2 = _zero(resumed.module)
    opt2.load_state_dict(saved)
    _train_ddp(resumed, opt2, data[2:], world)
    ours = full_state(resumed.module)
    assert_states_close(ours, dict(ref.named_parameters()), **TOL)
    assert states_differ(ours, full_state(ddp.module))


def _stages(model, n):
    """The unsplit model's layers, cut into ``n`` consecutive stages."""
    layers = [model.inp, *model.blocks, model.out]
    cuts = [round(i * len(layers) / n) for i in range(n + 1)]
    return [nn.Sequential(*layers[a:b]) for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("schedule", [ScheduleGPipe, Schedule1F1B])
def test_pipeline_matches_unsplit_model(world, schedule):
    if world.size == 1:
        pytest.skip("a pipeline needs two ranks or more")
    data = batches()
    ref = train_single(make_net(), data, lambda p: torch.optim.SGD(p, lr=0.1))
    full = make_net()
    stage_module = _stages(full, world.size)[world.rank]
    stage = PipelineStage(stage_module, world.rank, world.size, torch.device("cpu"))
    pipe = schedule(stage, n_microbatches=4, loss_fn=loss_fn)
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        if world.rank == 0:
            pipe.step(x)
        elif world.rank == world.size - 1:
            losses = []
            out = pipe.step(target=y, losses=losses)
            assert out.shape == (GLOBAL_BATCH, 3) and len(losses) == 4
        else:
            pipe.step()
        opt.step()
    # This rank's stage holds the reference's layers, trained alike.
    reference = _stages(ref, world.size)[world.rank]
    ours = full_state(stage_module)
    assert_states_close(ours, dict(reference.named_parameters()), **TOL)
    assert states_differ(ours, full_state(_stages(make_net(), world.size)[world.rank]))
