"""One line per rank: its host, the world size and an allreduce of the ranks' numbers."""

import socket
import sys

import torch
import torch.distributed as dist

import hpcddp

world = hpcddp.init()
total = torch.tensor([float(world.rank + 1)])
dist.all_reduce(total)
# One write for the line (print() under PYTHONUNBUFFERED writes the newline apart).
sys.stdout.write(f"host={socket.gethostname()} rank={world.rank} size={world.size} "
                 f"sum={total.item():g}\n")
sys.stdout.flush()
