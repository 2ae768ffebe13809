"""A rank that computes for SECONDS (no MPI call) after hpcddp started MPI and before
``hpcddp.init()``, as a program importing and building its model does; then every rank
sums one with ``dist.all_reduce`` and prints it.

    python late_init.py SECONDS
"""

import sys
import time

import hpcddp.ddp  # noqa: F401 - starts MPI, as any hpcddp import does
from mpi4py import MPI

if MPI.COMM_WORLD.rank == 1:
    began = time.monotonic()
    while time.monotonic() - began < float(sys.argv[1]):
        sum(range(10000))  # Python, holding the GIL between switches

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hpcddp  # noqa: E402

world = hpcddp.init()
one = torch.ones(1)
dist.all_reduce(one)
print(f"rank {world.rank} sum {one.item():g}", flush=True)
