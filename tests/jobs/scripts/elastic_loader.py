"""An ``hpcddp.elastic`` program that reads its samples with a ``ShardedLoader`` made
before ``run``, as programs do, and kept in the state.

    python elastic_loader.py DATA RECORD KILL_AT

DATA: an HDF5 file whose dataset ``x`` holds each sample's index. Each step takes one
batch of the loader and sums it with ``dist.all_reduce``; the state (the loader's
position and the step) is committed every 3 steps. At step KILL_AT rank 1 kills itself
with SIGKILL, and the others' all_reduce of that step meets the death. Each rank writes
one line per step to RECORD.<rank of the first world> (JSON: the recoveries so far, the
step, the size and the indices it took).
"""

import json
import os
import signal
import sys

import torch
import torch.distributed as dist

import hpcddp
from hpcddp import elastic
from hpcddp.data import ShardedLoader

data, record, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
world = hpcddp.init()
first_rank = world.rank
loader = ShardedLoader(data, ["x"], batch_size=1, shuffle=True, seed=3, backend="h5py")
state = elastic.State(loader=loader, step=0)
out = open(f"{record}.{first_rank}", "a")


@elastic.run
def train(state):
    rank, size = dist.get_rank(), dist.get_world_size()
    for (x,) in loader:
        if state.step == kill_at and first_rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        total = x.sum().clone()
        dist.all_reduce(total)
        out.write(json.dumps({"recoveries": len(state.recoveries), "step": state.step,
                              "size": size, "taken": x.flatten().long().tolist()}) + "\n")
        out.flush()
        state.step += 1
        if state.step % 3 == 0:
            state.commit()


train(state)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} finished at step {state.step}",
      flush=True)
