"""Train from an HDF5 file that rank 0 truncates in place after the first batch.

    python truncated_data.py DIR
"""

import os
import sys

import h5py
import numpy as np
import torch

import hpcddp
from hpcddp.data import ShardedLoader

torch.set_num_threads(1)
world = hpcddp.init()
path = os.path.join(sys.argv[1], "train.h5")
if world.rank == 0:
    with h5py.File(path, "w") as f:
        # 16 MiB, contiguous (the memmap reader): 8 MiB per rank, more than one 4 MiB
        # read, so batches after the first read come from the truncated file.
        f["x"] = np.zeros((4096, 1024), np.float32)
world.comm.Barrier()
loader = ShardedLoader(path, ["x"], batch_size=256, prefetch=0)
assert loader.backend == "memmap"
for step, (x,) in enumerate(loader):
    if step == 0:
        world.comm.Barrier()
        if world.rank == 0:
            os.truncate(path, 4096)
        world.comm.Barrier()
print(f"rank {world.rank}: read every batch of a truncated file", flush=True)
