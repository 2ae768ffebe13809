"""Rank 1 raises while every other rank is blocked in a collective."""

import time

import torch.distributed as dist

import hpcddp

world = hpcddp.init()
if world.rank == 1:
    time.sleep(0.5)  # let the others enter the barrier first
    raise ValueError("deliberate failure on rank one")
dist.barrier()
print("a rank passed the barrier, which must not happen", flush=True)
