"""A DDP program in ``hpcddp.elastic``'s shape: state committed every 3 steps, a
checkpoint every 2 commits, resumed by ``run`` from the newest one.

    python elastic_train.py CKPT OUT TOTAL [KILL_AT]

Trains to step TOTAL on the global batch of each step (made from the step's number, so a
resumed run sees the same data), each rank its slice. With KILL_AT, rank 1 kills itself
with SIGKILL during that step's backward, while rank 0 reduces. Rank 0 writes the final
parameters to OUT. Under ULFM the survivors go on inside the job: the rank and size are
read in the training function, whose world after a recovery is the survivors'. Each step
also sums the loss with ``dist.all_reduce`` (a collective of the program's own, on the
default group). ``ELASTIC_KILL_IN_RESET=R``: rank R of the survivors kills itself in the
reset callback, inside the recovery; with ``ELASTIC_RESET_COLLECTIVE=1`` the callback
then makes a collective, which fails on the others inside that recovery. ``ELASTIC_TIMES=1``: the dying rank prints when it
dies, and each rank when it completes its first step after a start or a recovery (Unix
time; for benchmarks/bench_recovery.py). ``ELASTIC_SIGNAL=SIGSTOP``: the dying rank stops
instead (a frozen process: alive, silent), for the failure detector to find;
``ELASTIC_SIGNAL=stuck``: it loops in Python for ever instead (alive, its heartbeats and
watchdog going on), for the watchdog to find at HPCDDP_TIMEOUT. ``ELASTIC_SAY_AT=S``:
rank 0 prints ``at step S`` when it reaches step S, for a harness to fault a node then,
while the ranks go on computing and reducing (tests/cluster/test_elastic_nodes.py).
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import hpcddp
from hpcddp import elastic

ckpt, out, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
GLOBAL = 12  # the global batch: rows of each step's data


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL, 5, generator=g), torch.randn(GLOBAL, 3, generator=g)


hpcddp.init()
torch.manual_seed(0)
model = hpcddp.DistributedDataParallel(
    nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)), bucket_cap_mb=0.0005)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
state = elastic.State(model, optimizer, step=0, checkpoint=ckpt, checkpoint_every=2)
kill_in_reset = os.environ.get("ELASTIC_KILL_IN_RESET")
reset_collective = os.environ.get("ELASTIC_RESET_COLLECTIVE") == "1"
times = os.environ.get("ELASTIC_TIMES") == "1"
say_at = int(os.environ.get("ELASTIC_SAY_AT", "-1"))


def die(grad):
    if times:
        print(f"dies at {time.time():.6f}", flush=True)
    how = os.environ.get("ELASTIC_SIGNAL", "SIGKILL")
    while how == "stuck":
        sum(range(10000))
    os.kill(os.getpid(), getattr(signal, how))


def on_reset():
    if kill_in_reset is not None and dist.get_rank() == int(kill_in_reset) \
            and len(state.recoveries) == 0:  # during the first recovery
        os.kill(os.getpid(), signal.SIGKILL)
    if reset_collective and len(state.recoveries) == 0:
        dist.all_reduce(torch.ones(1))  # fails on the others: the recovery is made again


state.register_reset_callbacks([on_reset])


@elastic.run
def train(state):
    rank, size = dist.get_rank(), dist.get_world_size()
    if state.resumed is not None:
        print(f"rank {rank} resumed at step {state.step}", flush=True)
    if state.recoveries:
        print(f"rank {rank} of {size} goes on at step {state.step}", flush=True)
    share = GLOBAL // size
    first = True
    while state.step < total:
        x, y = batch(state.step)
        mine = slice(rank * share, (rank + 1) * share)
        loss = F.mse_loss(model(x[mine]), y[mine])
        if state.step == kill_at and rank == 1 and not state.recoveries:
            model.module[0].weight.register_hook(die)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        summed = loss.detach().clone()
        dist.all_reduce(summed)
        if times and first:
            print(f"rank {rank} of {size}: first step at {time.time():.6f}", flush=True)
            first = False
        state.step += 1
        if state.step == say_at and rank == 0 and not state.recoveries:
            print(f"at step {say_at}", flush=True)
        if state.step % 3 == 0:
            state.commit()


train(state)
if dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump([p.detach().tolist() for p in model.parameters()], f)
print(f"rank {dist.get_rank()} finished at step {state.step}", flush=True)
