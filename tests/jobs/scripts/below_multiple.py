"""Futures and the progress pump at an MPI thread level below MULTIPLE.

Run with MPI4PY_RC_THREAD_LEVEL=funneled: no helper thread may call MPI, so hpcddp must
complete futures on the calling thread and say so, and still give the right sums.
"""

import warnings

import torch
import torch.distributed as dist
from torch import nn

import hpcddp

world = hpcddp.init()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t = torch.full((4,), float(world.rank))
    future = dist.all_reduce(t, async_op=True).get_future()
    completed_at_once = future.done()
    total = future.then(lambda f: f.value()[0].sum()).wait().item()
    model = hpcddp.DistributedDataParallel(nn.Linear(4, 2))
    model.reducer.progress_thread = True
    model(torch.ones(3, 4)).sum().backward()
said = sorted({str(w.message) for w in caught if "thread level" in str(w.message)})
print(f"rank {world.rank}: level={world.thread_level} at_once={completed_at_once} "
      f"total={total:g} notes={len(said)}", flush=True)
for line in said:
    print(f"rank {world.rank}: {line}", flush=True)
model.close()
