"""Save checkpoint 1, then try checkpoint 2 where the disk refuses it; report per rank.

    python save_fails.py DIR [fsize]

With ``fsize``, rank 0 gets a file-size limit (EFBIG) before the second save; otherwise DIR
is expected on a small tmpfs that fills up (ENOSPC).
"""

import resource
import sys

import torch

import hpcddp
import hpcddp.checkpoint as checkpoint

world = hpcddp.init()
model = torch.nn.Linear(256, 256)  # 257 KiB of state
checkpoint.save(sys.argv[1], model, step=1)
if len(sys.argv) > 2 and world.rank == 0:
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:
    checkpoint.save(sys.argv[1], model, step=2)
    print(f"rank {world.rank}: second save succeeded", flush=True)
except OSError as error:
    print(f"rank {world.rank}: {type(error).__name__} errno={error.errno}: {error}", flush=True)
