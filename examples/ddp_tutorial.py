"""PyTorch's DDP tutorial (ToyModel, demo_basic, demo_checkpoint) on hpcddp.

    mpiexec -n 2 python examples/ddp_tutorial.py

The lines that change from the tutorial are marked ``# hpcddp:``. There is no
``mp.spawn``, no MASTER_ADDR/MASTER_PORT and no ``setup()``: the launcher starts the
ranks and MPI tells each who it is.
"""

import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

import hpcddp                                                   # hpcddp: was torch.multiprocessing
from hpcddp import DistributedDataParallel as DDP               # hpcddp: was torch.nn.parallel


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def train_step(ddp_model, device):
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10, device=device))
    labels = torch.randn(20, 5, device=device)
    loss_fn(outputs, labels).backward()
    optimizer.step()


def demo_basic(world):
    print(f"Running basic DDP example on rank {world.rank}.")
    model = ToyModel().to(world.device)
    ddp_model = DDP(model, device_ids=[world.local_rank])     # unchanged (ignored on CPUs)
    train_step(ddp_model, world.device)
    print(f"Finished running basic DDP example on rank {world.rank}.")


def demo_checkpoint(world):
    print(f"Running DDP checkpoint example on rank {world.rank}.")
    model = ToyModel().to(world.device)
    ddp_model = DDP(model, device_ids=[world.local_rank])
    path = world.comm.bcast(tempfile.gettempdir() + f"/hpcddp-tutorial-{os.getpid()}.pt"
                            if world.is_main else None)
    if world.is_main:
        torch.save(ddp_model.state_dict(), path)
    dist.barrier()                                              # unchanged: MPI-backed
    ddp_model.load_state_dict(torch.load(path, map_location=world.device, weights_only=True))
    train_step(ddp_model, world.device)
    dist.barrier()
    if world.is_main:
        os.remove(path)
    print(f"Finished running DDP checkpoint example on rank {world.rank}.")


if __name__ == "__main__":
    world = hpcddp.init()                                       # hpcddp: was setup(rank, world_size)
    demo_basic(world)
    demo_checkpoint(world)
    dist.destroy_process_group()                                # unchanged (cleanup())
