"""A Horovod elastic program as its users write it (``import horovod.torch as hvd``,
``hvd.DistributedOptimizer``, ``hvd.elastic.TorchState``, ``@hvd.elastic.run``, a reset
callback), run unchanged through the alias.

    python horovod_elastic_train.py OUT TOTAL [KILL_AT]

Trains to step TOTAL. Each step's global batch is made from the step's number (12 rows:
every size from 1 to 4 splits it evenly), each rank takes its rows, and
``DistributedOptimizer`` averages the gradients: the mean over the global batch at any
size, so the run follows one process trained on every global batch
(``tests/support/elastic_reference.py``, with Adam stepped once on zero gradients by the
first sync, as Horovod's ``broadcast_optimizer_state`` does). The state is committed
every 3 steps. With KILL_AT, rank 1 kills itself with SIGKILL during that step's
backward, while the other ranks' gradient allreduces are in flight.
``ELASTIC_KILL_IN_RESET=R``: rank R of the survivors kills itself in the reset callback
that follows the first recovery. ``ELASTIC_TIMES=1``: the dying rank prints when it
dies, and each rank when it completes its first step after a start or a recovery (Unix
time; for benchmarks/bench_recovery.py). Rank 0 writes the final parameters to OUT.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd

GLOBAL = 12


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(GLOBAL, 5, generator=g), torch.randn(GLOBAL, 3, generator=g)


def main():
    out, total = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    kill_in_reset = os.environ.get("ELASTIC_KILL_IN_RESET")
    times = os.environ.get("ELASTIC_TIMES") == "1"
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    base = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    sizes = []

    def on_reset():
        sizes.append(hvd.size())
        if kill_in_reset is not None and hvd.rank() == int(kill_in_reset) \
                and len(state.recoveries) == 1:  # after the first recovery
            os.kill(os.getpid(), signal.SIGKILL)

    state.register_reset_callbacks([on_reset])

    def die(grad):
        if times:
            print(f"dies at {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        if state.recoveries:
            print(f"rank {rank} of {size} goes on at step {state.step}", flush=True)
        share = GLOBAL // size
        first = True
        while state.step < total:
            x, y = batch(state.step)
            mine = slice(rank * share, (rank + 1) * share)
            if state.step == kill_at and rank == 1 and not state.recoveries:
                model[0].weight.register_hook(die)
            optimizer.zero_grad()
            F.mse_loss(model(x[mine]), y[mine]).backward()
            optimizer.step()
            if times and first:
                print(f"rank {rank} of {size}: first step at {time.time():.6f}", flush=True)
                first = False
            state.step += 1
            if state.step % 3 == 0:
                state.commit()

    train(state)
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump([p.detach().tolist() for p in model.parameters()], f)
    print(f"rank {hvd.rank()} finished at step {state.step}, resets at sizes {sizes}",
          flush=True)


if __name__ == "__main__":
    main()
