"""A small DDP training job that goes wrong on one rank in the way argv[1] names.

uneven_exit     rank 1 trains one step more than the others, which then end
uneven_barrier  rank 1 trains one step more; the others wait in dist.barrier()
sleep           rank 1 sleeps in user code while the others wait in dist.all_reduce
mismatch        rank 0 calls dist.all_reduce while the others call dist.broadcast
exit3, exit0    rank 1 calls sys.exit(3) / sys.exit(0) in the middle of training
sigkill         rank 1 kills itself with SIGKILL in the middle of a step
loader_worker   rank 1's DataLoader worker hangs; the others wait in the DDP step
healthy         nothing goes wrong (the control)
slow_close      nothing goes wrong; at exit rank 1 is slow to close what is still open, so
                the others wait in the closing collectives (a timeline's gather) it has
                not reached after its departure note
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import hpcddp

STEPS = 4


class SlowToClose:
    """Closed at exit before any older owner, as lifetime closes newest first; slow on
    one rank."""

    def __init__(self, seconds):
        self.seconds = seconds

    def close(self):
        time.sleep(self.seconds)


class Rows(torch.utils.data.Dataset):
    """Eight rows; on the rank that hangs, reading one never returns."""

    def __init__(self, hang):
        self.hang = hang

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.hang and i == 4:
            time.sleep(10_000)
        return torch.full((4,), float(i))


def _named_segments():
    """The MPI library's shared-memory files this process maps under a name."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/dev/shm/" in line
                       and not line.rstrip().endswith("(deleted)")})


def say(line):
    """One write for the line: under PYTHONUNBUFFERED, print() writes the newline apart,
    and another rank's line can land between them in the launcher's output."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(scenario):
    torch.set_num_threads(1)
    from mpi4py import MPI  # MPI_Init, as a script that imports mpi4py first does
    say(f"segments before init: {' '.join(_named_segments()) or '-'}")
    world = hpcddp.init()
    say(f"rank {world.rank} pid {os.getpid()}")
    torch.manual_seed(0)
    model = hpcddp.DistributedDataParallel(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    odd = world.rank == 1
    steps = STEPS + (1 if odd and scenario.startswith("uneven") else 0)
    batches = [torch.full((2, 4), float(s)) for s in range(steps)]
    if scenario == "loader_worker":
        batches = torch.utils.data.DataLoader(Rows(hang=odd), batch_size=2, num_workers=1,
                                              multiprocessing_context="spawn")
    for step, batch in enumerate(batches):
        if step == 2 and odd:
            if scenario == "exit3":
                sys.exit(3)
            if scenario == "exit0":
                sys.exit(0)
            if scenario == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
        loss = model(batch).square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scenario in ("sleep", "mismatch") and step == 2:
            if scenario == "sleep" and odd:
                time.sleep(10_000)
            total = torch.ones(3)
            if scenario == "mismatch" and world.rank != 0:
                dist.broadcast(total, 0)
            else:
                dist.all_reduce(total)
    if scenario == "uneven_barrier":
        dist.barrier()
    if scenario == "slow_close":
        from hpcddp.comm import lifetime
        slow = SlowToClose(1.0 if odd else 0.0)
        lifetime.register(slow, keep_alive=True)
    print(f"rank {world.rank} finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
