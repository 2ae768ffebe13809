"""What tests/jobs/scripts/elastic_train.py and horovod_elastic_train.py must reach,
computed apart from them: one process trained on every step's global batch (the same
rows the scripts make from the step's number), for the elastic tests and
benchmarks/bench_recovery.py."""

import torch
import torch.nn.functional as F
from torch import nn


def elastic_reference(total: int, zero_step_first: bool = False):
    """The parameters after ``total`` steps of Adam on the global batches.

    ``zero_step_first``: Adam steps once on zero gradients first, as Horovod's
    ``broadcast_optimizer_state`` does to an optimizer that has no state yet (the first
    ``hvd.elastic.run`` sync): the parameters stay, Adam's step count does not.
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    if zero_step_first:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    for step in range(total):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(12, 5, generator=g), torch.randn(12, 3, generator=g)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]
