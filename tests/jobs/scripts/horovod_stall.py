"""Rank 1 starts an allreduce that rank 0 never starts: rank 0 computes on (a loop with
no end). Horovod's stall check must warn, and past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
end the job, naming the ranks on each side."""

import torch

import hpcddp.horovod as hvd

torch.set_num_threads(1)
hvd.init()
hvd.allreduce(torch.ones(2), name="warm-up")
print(f"rank {hvd.rank()} warmed up", flush=True)
if hvd.rank() == 1:
    hvd.allreduce(torch.ones(2), name="only-on-rank-1")
else:
    x = torch.ones(64, 64)
    while True:  # the stuck computation
        x = (x @ x).clamp_(-1, 1)
