"""DDP training where one rank (argv[1], or none) does five times the others' work per
step: its own work, not a wait in hpcddp. Rank 0 prints what hpcddp said; exit 0."""

import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import hpcddp

slow = int(sys.argv[1]) if len(sys.argv) > 1 else -1
world = hpcddp.init()
torch.manual_seed(0)
model = hpcddp.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(),
                                                     nn.Linear(64, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    time.sleep(0.075 if world.rank == slow else 0.015)  # the step's own work
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(step * 10 + world.rank))
    loss = F.mse_loss(model(x), torch.zeros(8, 4))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"rank {world.rank}: trained 60 steps", flush=True)
model.close()
