"""A user's training program: an MLP of 1024-wide layers on random data, gradients in
1 MiB buckets, no pause between steps. Every rank says where it runs; rank 0 prints each
step. ``python mlp.py STEPS``"""
import socket
import sys

import torch
import torch.nn.functional as F
from torch import nn

import hpcddp

world = hpcddp.init()
print(f"rank {world.rank} of {world.size} on {socket.gethostname()}", flush=True)
torch.manual_seed(0)
width = 1024
model = hpcddp.DistributedDataParallel(
    nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                  nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)),
    bucket_cap_mb=1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
generator = torch.Generator().manual_seed(world.rank)
for step in range(int(sys.argv[1])):
    x = torch.randn(64, width, generator=generator)
    y = torch.randint(0, 10, (64,), generator=generator)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if world.is_main:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
print(f"rank {world.rank} done", flush=True)
hpcddp.shutdown()
