"""What tests/jobs/scripts/elastic_train.py and horovod_elastic_train.py must reach,
computed apart from them: one process trained on every step's global batch (the same
rows the scripts make from the step's number), for the elastic tests and
benchmarks/bench_recovery.py."""

import json

import torch
import torch.nn.functional as F
from torch import nn


def elastic_reference(total: int):
    """The parameters after ``total`` steps of Adam on the global batches."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(total):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(12, 5, generator=g), torch.randn(12, 3, generator=g)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


SAMPLES = 48  # horovod_elastic_train.py's dataset: rows 0..47, one epoch


def sampler_dataset():
    """horovod_elastic_train.py's dataset: ``SAMPLES`` rows of (x, y)."""
    g = torch.Generator().manual_seed(7)
    return torch.randn(SAMPLES, 5, generator=g), torch.randn(SAMPLES, 3, generator=g)


def sampler_reference(before: int, after: int, committed: int = 6):
    """The parameters of one process stepping through horovod_elastic_train.py's epoch
    as a job of ``before`` ranks does up to its commit at step ``committed``, then one of
    ``after`` ranks from there: one rank per row and step, so each step's global batch
    is the next ``size`` rows in order (an unshuffled ``ElasticSampler`` gives rank ``r``
    the rows ``r, r + size, ...`` of what is left). Adam steps once on zero gradients
    first, as Horovod's ``broadcast_optimizer_state`` does to an optimizer with no state.
    """
    x, y = sampler_dataset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    starts = [k * before for k in range(committed)]
    starts += list(range(committed * before, SAMPLES, after))
    for start in starts:
        size = before if start < committed * before else after
        optimizer.zero_grad()
        F.mse_loss(model(x[start:start + size]), y[start:start + size]).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


CLOSE = {"rtol": 1e-5, "atol": 1e-6}  # a reduction's order apart from one process's sums


def assert_trained_as(out, reference):
    """The parameters a job's rank 0 wrote to ``out`` (JSON lists) are ``reference``'s."""
    for ours, one in zip(json.loads(out.read_text()), reference):
        torch.testing.assert_close(torch.tensor(ours), one, **CLOSE)


def trained_as(out, reference) -> bool:
    """Whether ``out`` exists and holds ``reference``'s parameters (for the benchmarks,
    which count the runs that do)."""
    return out.exists() and all(torch.allclose(torch.tensor(ours), one, **CLOSE)
                                for ours, one in zip(json.loads(out.read_text()), reference))
