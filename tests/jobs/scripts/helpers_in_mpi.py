"""DDP training while every helper thread that calls MPI has work: a comm hook's futures
and an async all_reduce's ``.then`` completed in the background, the progress pump during
backward, and the watchdog asking the other ranks about a stall (rank 1 sleeps in user
code before step 10 while the others wait in the step's reduction)."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import hpcddp

world = hpcddp.init()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                    nn.Linear(256, 64))
model = hpcddp.DistributedDataParallel(net, bucket_cap_mb=0.1)
model.reducer.progress_thread = True
model.register_comm_hook(None, default_hooks.allreduce_hook)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
sums = []
for step in range(30):
    if step == 10 and world.rank == 1:
        time.sleep(1.5)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(step * world.size + world.rank))
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    future = dist.all_reduce(torch.ones(1000), async_op=True).get_future()
    sums.append(future.then(lambda f: f.value()[0][0].item()).wait())
assert sums == [float(world.size)] * 30, sums
print(f"rank {world.rank}: level={world.thread_level} steps=30", flush=True)
model.close()
