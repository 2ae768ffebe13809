"""One line per rank: its host, the world size and an allreduce of the ranks' numbers."""

import socket

import torch
import torch.distributed as dist

import hpcddp

world = hpcddp.init()
total = torch.tensor([float(world.rank + 1)])
dist.all_reduce(total)
print(f"host={socket.gethostname()} rank={world.rank} size={world.size} sum={total.item():g}",
      flush=True)
