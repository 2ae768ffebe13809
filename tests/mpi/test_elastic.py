"""``hpcddp.elastic``: a commit is kept apart from the live state and comes back whole
(parameters, Adam's moments, a scheduler, a ShardedLoader's position, plain values, the
random generators); ``sync`` and ``run`` start every rank from the lowest rank's state;
``commit`` writes a checkpoint every ``checkpoint_every`` commits that ``run`` resumes
from. References: copies the test makes itself, and rank 0's values gathered over MPI."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
from hpcddp import elastic


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))


def _train(model, optimizer, scheduler, steps, rank):
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        scheduler.step()


def _parts(world, seed=0):
    model = hpcddp.DistributedDataParallel(_model(seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def test_restore_brings_back_the_commit_whole_and_apart_from_the_live_state(world):
    model, optimizer, scheduler = _parts(world)
    state = elastic.State(model, optimizer, scheduler=scheduler, step=0, note=["a"])
    _train(model, optimizer, scheduler, 3, world.rank)
    state.step = 3
    state.commit()
    params = [p.detach().clone() for p in model.parameters()]
    moments = copy.deepcopy(optimizer.state_dict())
    lr = scheduler.get_last_lr()
    draws = (torch.rand(3), np.random.rand(2))
    _train(model, optimizer, scheduler, 4, world.rank)
    state.step, state.note = 7, ["b"]
    state.restore()
    assert state.step == 3 and state.note == ["a"]
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p, q)
    now = optimizer.state_dict()
    for key, saved in moments["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(now["state"][key][name], saved[name]), (key, name)
    assert scheduler.get_last_lr() == lr
    assert torch.equal(torch.rand(3), draws[0]) and np.array_equal(np.random.rand(2), draws[1])
    # The optimizer does not keep the commit's tensors: training on leaves it as it was.
    _train(model, optimizer, scheduler, 2, world.rank)
    state.restore()
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p, q)


def test_run_starts_every_rank_from_rank_0s_state(world):
    # A module of each rank's own (DDP would make them alike at once), trained apart.
    model = _model(seed=world.rank)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    _train(model, optimizer, scheduler, world.rank + 1, world.rank)
    values = {"step": 10 * world.rank, "epoch": world.rank}
    rank0 = world.comm.bcast(([p.detach().clone() for p in model.parameters()],
                              copy.deepcopy(optimizer.state_dict()["state"]), values),
                             root=0)
    state = elastic.State(model, optimizer, scheduler=scheduler, **values)

    @elastic.run
    def body(state, tag):
        return tag, state.step, state.epoch, [p.detach().clone() for p in
                                              state.model.parameters()]

    tag, step, epoch, params = body(state, "called")
    assert (tag, step, epoch) == ("called", rank0[2]["step"], rank0[2]["epoch"])
    for p, q in zip(params, rank0[0]):
        assert torch.equal(p, q)
    for key, saved in rank0[1].items():
        assert torch.equal(optimizer.state_dict()["state"][key]["exp_avg"], saved["exp_avg"])
    state.step = -1
    state.restore()  # run committed what it started from
    assert state.step == rank0[2]["step"]


def test_commit_saves_a_checkpoint_every_n_commits_and_run_resumes_from_it(world, folder):
    model, optimizer, scheduler = _parts(world)
    state = elastic.State(model, optimizer, scheduler=scheduler, checkpoint=folder,
                          checkpoint_every=2, step=0)
    for step in range(1, 6):
        _train(model, optimizer, scheduler, 1, world.rank)
        state.step = step
        state.commit()
        if step == 4:
            at_four = [p.detach().clone() for p in model.parameters()]
    later = _parts(world, seed=99)
    resumed = elastic.State(*later[:2], scheduler=later[2], checkpoint=folder,
                            checkpoint_every=2, step=0)
    seen = elastic.run(lambda s: (s.step, s.commits, s.resumed.step))(resumed)
    assert seen == (4, 4, 4)
    for p, q in zip(resumed.model.parameters(), at_four):
        assert torch.equal(p, q)


def test_bad_arguments_are_refused_naming_the_fix(world):
    with pytest.raises(ValueError, match="checkpoint=<directory>"):
        elastic.State(_model(0), checkpoint_every=3)
    with pytest.raises(TypeError, match="no state_dict"):
        elastic.State(model=object())
    with pytest.raises(RuntimeError, match="before any commit"):
        elastic.State(_model(0)).restore()
