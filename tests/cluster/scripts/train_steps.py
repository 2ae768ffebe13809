"""Train a small DDP model for a number of steps, checkpointing every few, on any nodes.

    python train_steps.py CKPT STEPS [--every K] [--pause S] [--width W]
                          [--trigger FILE --victim RANK --act stuck|slow]

Each step's batch comes from a generator seeded by the step and the rank, so a run that
resumes from a checkpoint sees the batches an uninterrupted one would. Rank 0 prints
``step N`` after each step and, at the end, a digest of the parameters. Once ``--trigger``
exists, rank ``--victim`` gets stuck in user code (``stuck``) or takes five times as long
per step from then on (``slow``): the faults of benchmarks/bench_faults.py that live in
the program, not the machine.
"""

import argparse
import hashlib
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
import hpcddp.checkpoint as checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("ckpt")
parser.add_argument("steps", type=int)
parser.add_argument("--every", type=int, default=5)
parser.add_argument("--pause", type=float, default=0.0)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--trigger", default=None)
parser.add_argument("--victim", type=int, default=-1)
parser.add_argument("--act", choices=("stuck", "slow"), default="stuck")
args = parser.parse_args()

world = hpcddp.init()
if world.is_main:  # what MPI runs on, for the fault soak's record
    from hpcddp.startup.mpi_library import mpich_network_module
    print(f"network_module={mpich_network_module()}", flush=True)
torch.manual_seed(0)
model = hpcddp.DistributedDataParallel(
    nn.Sequential(nn.Linear(32, args.width), nn.ReLU(), nn.Linear(args.width, 4)),
    bucket_cap_mb=0.05)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
resumed = checkpoint.load(args.ckpt, model, optimizer)
if resumed is not None:
    step = resumed.step
    if world.is_main:
        print(f"resumed at step {step}", flush=True)
last = 0.0  # the last step's seconds
while step < args.steps:
    started = time.monotonic()
    if world.rank == args.victim and args.trigger and os.path.exists(args.trigger):
        while args.act == "stuck":
            time.sleep(3600)
        time.sleep(4 * last)  # this step takes five times its usual time
    generator = torch.Generator().manual_seed(step * 1000 + world.rank)
    x = torch.randn(16, 32, generator=generator)
    y = torch.randn(16, 4, generator=generator)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step % args.every == 0:
        checkpoint.save(args.ckpt, model, optimizer, step=step)
    if world.is_main:
        print(f"step {step}", flush=True)
    time.sleep(args.pause)
    if not (args.trigger and os.path.exists(args.trigger)):
        last = time.monotonic() - started
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
if world.is_main:
    print(f"parameters_sha256={digest.hexdigest()}", flush=True)
