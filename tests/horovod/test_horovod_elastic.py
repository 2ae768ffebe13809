"""``hvd.elastic`` at the job's fixed size, against references made on every rank: rank
0's state built again from its seed, the order ``random.Random(seed + epoch)`` gives, and
one process trained on the global batch."""

import random

import pytest
import torch
from torch import nn

import hpcddp.horovod as hvd


@pytest.fixture(scope="module", autouse=True)
def horovod(world):
    hvd.init()
    yield
    hvd.shutdown()


def _model(seed):
    torch.manual_seed(seed)
    return nn.Linear(4, 2)


def _stepped(seed):
    model = _model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.full((3, 4), float(seed))).sum().backward()
    opt.step()
    return model, opt


def test_run_starts_every_rank_from_rank_0s_state():
    model, opt = _stepped(10 + hvd.rank())
    state = hvd.elastic.TorchState(model, opt, epoch=hvd.rank() + 5, note=[hvd.rank()])

    @hvd.elastic.run
    def train(state):
        return state.epoch, state.note, state.model, state.optimizer

    epoch, note, got_model, got_opt = train(state)
    ref_model, ref_opt = _stepped(10)
    assert (epoch, note) == (5, [0])
    assert got_model is model and got_opt is opt
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
    for p, q in zip(opt.state.values(), ref_opt.state.values()):
        assert torch.equal(p["exp_avg"], q["exp_avg"]) and torch.equal(p["step"], q["step"])


def test_restore_undoes_what_came_after_the_commit():
    model, opt = _stepped(3)
    sampler = hvd.elastic.ElasticSampler(range(20), shuffle=False)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, batch=1)
    sampler.record_batch(0, 2)
    state.batch = 2
    state.commit()
    kept = [p.detach().clone() for p in model.parameters()]
    kept_step = [s["step"].clone() for s in opt.state.values()]
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    sampler.record_batch(1, 2)
    state.batch = 3
    state.restore()
    assert state.batch == 2 and sampler.processed_num == 2 * hvd.size()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), kept))
    assert [s["step"] for s in opt.state.values()] == kept_step


def test_the_sampler_splits_what_is_left_of_the_epoch():
    n, me = hvd.size(), hvd.rank()
    sampler = hvd.elastic.ElasticSampler(range(23), shuffle=True, seed=4)
    sampler.set_epoch(2)
    order = list(range(23))
    random.Random(4 + 2).shuffle(order)
    shares = hvd.allgather_object(list(sampler))
    assert sorted(set(i for share in shares for i in share)) == list(range(23))
    assert list(sampler) == (order + order)[:len(sampler) * n][me::n]
    sampler.record_batch(0, 3)  # 3 samples done on every rank
    sampler.reset()
    left = order[3 * n:]
    assert sorted(set(i for share in hvd.allgather_object(list(sampler)) for i in share)) \
        == sorted(left)


def test_elastic_training_follows_one_process_on_the_global_batch():
    n, me = hvd.size(), hvd.rank()
    data = torch.randn(8 * n, 4, generator=torch.Generator().manual_seed(8))
    target = torch.randn(8 * n, 2, generator=torch.Generator().manual_seed(9))
    one = _model(1)
    one_opt = torch.optim.SGD(one.parameters(), lr=0.1, momentum=0.5)
    for start in range(0, 8 * n, 2 * n):  # the sampler's order: rank r takes r, r + n, ...
        one_opt.zero_grad()
        nn.functional.mse_loss(one(data[start:start + 2 * n]),
                               target[start:start + 2 * n]).backward()
        one_opt.step()
    model = _model(1 + me)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(range(8 * n), shuffle=False)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, batch=0)

    @hvd.elastic.run
    def train(state):
        indices = list(state.sampler)
        for state.batch in range(state.batch, 4):
            rows = indices[2 * state.batch:2 * state.batch + 2]
            opt.zero_grad()
            nn.functional.mse_loss(model(data[rows]), target[rows]).backward()
            opt.step()
            state.sampler.record_batch(state.batch, 2)
            state.commit()

    train(state)
    for p, q in zip(model.parameters(), one.parameters()):
        torch.testing.assert_close(p, q)


def test_hosts_updated_resets_and_runs_again_an_operation_error_restores_and_raises():
    calls, resets = [], []
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, value=hvd.rank())
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        calls.append(state.value)
        if len(calls) == 1:
            state.value = 99
            raise hvd.HostsUpdatedInterrupt(skip_sync=False)
        return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()  # the engine runs again

    assert train(state) == hvd.size()
    assert calls == [0, 0] and resets == [hvd.size()]

    @hvd.elastic.run
    def failing(state):
        state.value = 7
        raise hvd.HorovodInternalError("an operation failed")

    state.commit()
    with pytest.raises(hvd.HorovodInternalError):
        failing(state)
    assert state.value == 0
