"""A Horovod elastic program as its users write it (``import horovod.torch as hvd``,
``hvd.DistributedOptimizer``, an ``hvd.elastic.ElasticSampler`` under a DataLoader,
``hvd.elastic.TorchState``, ``@hvd.elastic.run``, ``record_batch``, a reset callback),
run unchanged through the alias.

    python horovod_elastic_train.py OUT [KILL_AT]

One epoch over 48 rows (``tests/support/elastic_reference.py``'s ``sampler_dataset``),
one row per rank and step, unshuffled; ``DistributedOptimizer`` averages the gradients,
so each step follows one process on the step's global batch at any size
(``sampler_reference``). The state is committed every 3 steps. With KILL_AT, rank 1
kills itself with SIGKILL during that step's backward, while the other ranks' gradient
allreduces are in flight. ``ELASTIC_KILL_IN_RESET=R``: rank R of the survivors kills
itself in the reset callback that follows the first recovery. ``ELASTIC_TIMES=1``: the
dying rank prints when it dies, and each rank when it completes its first step after a
start or a recovery (Unix time; for benchmarks/bench_recovery.py). Rank 0 writes the
final parameters to OUT.
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "support"))
from elastic_reference import sampler_dataset  # noqa: E402


def main():
    out = sys.argv[1]
    kill_at = int(sys.argv[2]) if len(sys.argv) > 2 else None
    kill_in_reset = os.environ.get("ELASTIC_KILL_IN_RESET")
    times = os.environ.get("ELASTIC_TIMES") == "1"
    torch.set_num_threads(1)
    hvd.init()
    dataset = torch.utils.data.TensorDataset(*sampler_dataset())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    base = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, step=0)
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
        first = True
        for batch_idx, (x, y) in enumerate(loader):
            if state.step == kill_at and rank == 1 and not state.recoveries:
                model[0].weight.register_hook(die)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            if times and first:
                print(f"rank {rank} of {size}: first step at {time.time():.6f}", flush=True)
                first = False
            state.sampler.record_batch(batch_idx, 1)
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
